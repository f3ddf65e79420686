"""The Application layer of ACP: the one entry every transport calls (``ServiceFacade``),
the handlers it dispatches to, and the domain behind them.

Presentation code (gateway, client) may import this package's public modules and
``contract``; it never imports ``domain`` or ``store``.
"""
