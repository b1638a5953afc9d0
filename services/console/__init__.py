"""The operator console: a web page to watch every loop live, answer gates, steer and inspect."""
