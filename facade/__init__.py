"""The Application layer of ACP: the servicers every transport calls, and the domain behind them.

Presentation code (gateway, client) may import this package's public modules and
``contract``; it never imports ``domain`` or ``store``.
"""
