"""The ACP contract at run time: operation catalog, errors, versions, JSON codec, envelope.

Everything here is derived from the generated descriptors and imports no domain code,
so every layer (facade, gateway, clients, CLI) can share it.
"""
