"""What an operator sees of a job and may do to it: the layer the command line and the console share.

Both tools stand on it side by side and neither imports the other, so a job looks the same (and is masked
the same) whether ``job show`` prints it or the console draws it, and a decision is made in one place.

* `_mask.py`: `Masker`, the one way a value from the store or a journal reaches an operator: secrets
  masked (the `Redactor`, then every value under a key named like a credential), size bounded.
* `_view.py`: `read_job_state` (the row, its approval, its wait and the events not yet taken) and
  `show_job` (the same, masked, as the lines both tools show).
* `_approve.py`: `approve_parked`, approving exactly the call a job is parked on.
"""
