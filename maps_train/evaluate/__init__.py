"""Evaluation: the six data sets, Cover-EM/EM/F1 and letter accuracy, the systems x data sets matrix run through
the agent runner, cost (calls, tokens, retrievals, latency, estimated compute), reports, plots and W&B."""
