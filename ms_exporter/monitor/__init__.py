"""The train-time core: the MindSpore callback and what it runs on every step."""
