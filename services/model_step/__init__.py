"""The model-step service: drives loops from the work queue (``python -m services.model_step``).

``models/`` holds the provider adapters (demo, scripted, OpenAI-compatible, Anthropic).
"""
