"""The incident corpus: raw traces of real vLLM incidents, their recorder and their scoreboard."""
