"""Client-side data-plane transports; each offers ordered bytes to an exchange."""
