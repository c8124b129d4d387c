"""Running the roles as separate processes on many hosts, sharing metadata."""
