"""What both sides of the Batch API agree on: its objects and line shapes, and
the translations between OpenAI's chat requests and Anthropic's and Gemini's.
"""
