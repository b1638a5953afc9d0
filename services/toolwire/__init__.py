"""What the tool caller and the tool workers agree on: call protocol, tool specs, the tools bucket, spans."""
