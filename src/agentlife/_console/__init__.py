"""``python -m agentlife console``: a web console over the job store and the session journals.

- `_server`: the aiohttp application (routes, the store it reads, security headers, the action rules) and
  ``serve``;
- `_data`: what a page shows, read through the stores' calls (``list_jobs`` with a keyset cursor, the
  row, approval and wait ``job show`` reads, the conversation rows, the journals), bounded and redacted;
- `_timeline`: a job's lifecycle as spans on one time axis and its inline SVG;
- `_render`: the HTML around ``templates/base.html``, every value escaped;
- ``templates/`` and ``static/``: the page shell, one stylesheet and one small script (no build step).

aiohttp and this package load only when the console runs, never for another command.
"""
