"""The real-vLLM test tier (`pytest -m vllm`): see vllmtier.py and conftest.py."""
