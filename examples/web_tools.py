"""The web tools as an application serves them: ``criogenai worker --tools examples.web_tools``.

``search`` asks the SearxNG at ``SEARXNG_URL``; ``read_page`` reads public pages under the default
WebPolicy; ``read_docs`` reads only the hosts it names.
"""

from __future__ import annotations

import os

from criogenai.web import SearxNG, WebPolicy, page_reader, read_page, web_search

__all__ = ["read_docs", "read_page", "search"]

search = web_search(SearxNG(os.environ.get("SEARXNG_URL", "http://localhost:8080")))
read_docs = page_reader(WebPolicy(allow_hosts=("docs.python.org", "*.readthedocs.io")), name="read_docs")
