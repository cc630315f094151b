"""Analyses of search behaviour: search momentum (β fitting, S_t), drift across rounds, and stop rounds.

- `sequences`: question + ordered rounds of sub-queries, from JSONL, MuSiQue gold decompositions or agent traces.
- `embed`: sub-queries and evidence into unit vectors, one q_t per step (first / mean / every path).
- `momentum`: m_t = β_t m_{t-1} + (1-β_t)(q_t - q_{t-1}), S_t = cos(m_t, q_{t+1} - q_0), β_t fitted by L-BFGS-B.
- `drift`, `stops`: per-round drift curves and stop-round shares, per method.
- `report`: Markdown/CSV tables, PNG plots, optional W&B logging; `cli`: `maps-train analyze ...`.
"""
