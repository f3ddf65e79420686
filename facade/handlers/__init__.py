"""The handlers of every operation, one group per module, and the table (``table``)
that maps each operation of the catalog to one of them. Handlers turn requests into
domain calls and results into responses; the domain authorizes, on the ``CallContext``."""
