"""Tools of the fleet tests for collections and memory, as an application's tool module would be.

The workers import this module (``--tools tests.knowledge_tools``): the collection's store is the
PostgreSQL every worker reaches, and memory uses the fleet's Redis (the default on a worker).
"""

from __future__ import annotations

import os

from criogenai.documents import Collection, PostgresStore
from criogenai.memory import Memory

POSTGRES = os.environ.get("CRIOGENAI_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
TABLE = os.environ.get("CRIOGENAI_TEST_DOCS_TABLE", "crg_test_unset")

handbook = Collection("handbook", PostgresStore(POSTGRES, table=TABLE))
search_handbook = handbook.as_tool("search_handbook", "Search the clinic handbook by keywords.", limit=5)

memory = Memory(namespace="fleet-test", max_chars=200, max_memories=3)
remember, forget, search_memory = memory.tools
