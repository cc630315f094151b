"""The baselines the paper compares MAPS against, each an `Engine` registered under its method name:
`vanilla` (FlashRAG's retrieve-then-generate), `search_o1` (reasoning with search calls and a reason-in-documents
condenser), `parallel_search` (several `##`-separated sub-queries per search call) and `s3` (a searcher keeps
documents, a frozen generator answers from them). Prompts: `maps_train/agents/prompts/baselines/`.

Role names (what `roles:` in a recipe routes): vanilla "generator"; search_o1 "reasoner", "condenser";
parallel_search "reasoner"; s3 "searcher", "generator".
"""

from maps_train.agents.baselines.parallel_search import ParallelSearchEngine
from maps_train.agents.baselines.s3 import S3Engine
from maps_train.agents.baselines.search_o1 import SearchO1Engine
from maps_train.agents.baselines.vanilla import VanillaRAGEngine

__all__ = ["ParallelSearchEngine", "S3Engine", "SearchO1Engine", "VanillaRAGEngine"]
