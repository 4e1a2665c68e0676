"""``python -m agentlife console``: a web console over the job store and the session journals.

- `_server`: the aiohttp application (routes, security headers, the action rules, the signed note an
  action leaves) and ``serve``;
- `_store`: the store it reads, checked on every request to be the one at the configured path (a SQLite
  file deleted or replaced is noticed), and the check that an action was recorded there;
- `_data`: what a page shows, read through the stores' calls (``list_jobs`` with a keyset cursor, the
  job view ``job show`` prints too, the conversation rows, the journals), masked and bounded;
- `_timeline`: a job's lifecycle as spans on one time axis and its inline SVG;
- `_render`: the HTML around ``templates/base.html``, every value escaped;
- ``templates/`` and ``static/``: the page shell, one stylesheet and one small script (no build step).

It stands beside the command line on `agentlife._jobs` (the job view, the `Masker` everything a page
shows from the store or a journal goes through, approving a parked call) and imports nothing from it.
aiohttp and this package load only when the console runs, never for another command.
"""
