"""maps-train: distil the MAPS multi-hop retrieval agent into small per-role LoRA adapters.

Sub-packages are the stages of the pipeline, each owning one job:
retrieval (corpora, encoders, FAISS/BM25 search, retrieval service), llm (batched chat backends, routing,
cost ledger), agents (MAPS, ablations, baselines), traces (trace records, SFT sets), train (LoRA SFT under
accelerate), serve (vLLM multi-LoRA), evaluate (datasets, metrics, suites, reports), analysis (momentum,
drift, stop rounds).
"""

__version__ = "0.1.0"
