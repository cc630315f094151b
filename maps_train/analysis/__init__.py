"""Analyses of search behaviour (paper 3.2-3.4), from files or from the agent's own runs.

- `sequences`: question + ordered rounds of sub-queries, from JSONL, MuSiQue gold decompositions or traces.
- `trace_reader`: the rounds a method actually searched, read from its `traces.jsonl` (one rule, per-method notes).
- `gold`: gold evidence passages from question metadata (realdata, FlashRAG HotpotQA/2Wiki/MuSiQue layouts).
- `runs`: run folders and suite output folders; question metadata looked up from the suite's data sets.
- `inputs`: what each command reads, per method (sequences, stop rounds), from any accepted input.
- `embed`: sub-queries and evidence into unit vectors.
- `momentum`: m_t = β_t m_{t-1} + (1-β_t)(q_t - q_{t-1}), S_t = cos(m_t, q_{t+1} - q_0), β_t by L-BFGS-B (β_1 = 0).
- `drift`, `stops`: accumulated change of cos(m_t, q_0) per round; stop rounds from `retrieval_rounds`.
- `sections`: each analysis over several methods, written as tables and a plot; `suite`: all three at once.
- `report`: Markdown/CSV tables, PNG plots, W&B logging; `cli`: `maps-train analyze ...`.
"""
