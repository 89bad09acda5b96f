"""Tenants: which namespaces a token may use, with what rights and quotas."""
