"""Stand-in vLLM and SGLang servers, and the harness the launch tests run them with."""
