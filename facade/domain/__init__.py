"""Domain services: sessions, plans, registries, context and the event log. Only the facade calls them."""
