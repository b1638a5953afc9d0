"""The caller side of tool calls (in the model-step): the tools registry, the call client, the batch executor."""
