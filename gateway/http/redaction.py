"""Stream tickets never reach a log: an HTTP server's access log writes the query string,
where a browser's EventSource must carry its ticket.

``agents serve`` writes no access log; a user who runs the gateway's application under a
server that does gets the ticket's value replaced in every access-log record, whatever
the log's format.
"""

from __future__ import annotations

import logging
import re

ACCESS_LOGGERS = ("uvicorn.access", "gunicorn.access", "hypercorn.access")
_TICKET = re.compile(r"([?&;]ticket=)[^&;\s\"]*")
REDACTED = r"\1[redacted]"


def redact(text: str) -> str:
    return _TICKET.sub(REDACTED, text) if "ticket=" in text else text


class TicketRedaction(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(arg) if isinstance(arg, str) else arg for arg in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: redact(v) if isinstance(v, str) else v for k, v in record.args.items()}
        return True


def install() -> None:
    """Once per logger, however many applications are built."""
    for name in ACCESS_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, TicketRedaction) for f in logger.filters):
            logger.addFilter(TicketRedaction())
