"""A request body on its way in: its encoding and the memory it may hold."""
