"""maps-train: distil the MAPS multi-hop retrieval agent into small per-role LoRA adapters.

Sub-packages are the stages of the pipeline, each owning one job, over a small foundation (config, recipe,
tracking, platform, JSON I/O) and the records every stage shares (`records`: answers and their cost, traces,
metrics, the keyed JSONL store): retrieval (corpora, encoders, FAISS/BM25 search, retrieval service), llm
(batched chat backends, routing), agents (MAPS, ablations, baselines), traces (teacher runs, SFT sets), train
(LoRA SFT under accelerate), serve (vLLM multi-LoRA), evaluate (datasets, suites, reports), analysis (momentum,
drift, stop rounds). docs/architecture.md gives the layers; lower layers never import higher ones.
"""

__version__ = "0.1.0"
