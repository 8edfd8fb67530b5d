"""The call runner's parts, shared by the worker's Celery task and the embedded engine: the
executor (one attempt of a call: context, time limit, cancel, outcome) and the outcomes and
results a call is filed with. It imports neither side, and no Celery."""
