"""Domain services, one package (room) per thing the service does: sessions, orchestrators,
plans, registries, models, context, events, access, bounded work (docs/architecture.md, "The
rooms of the domain"). Only the facade calls them."""
