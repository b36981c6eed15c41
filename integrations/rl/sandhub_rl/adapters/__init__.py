"""Templates for agent frameworks whose sandboxes run a server of their own."""
