"""Built-in models and clusters (YAML under models/ and clusters/) and resolving a user's reference to one."""
