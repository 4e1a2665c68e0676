"""What an operator sees of a job and may do to it: the layer the tools and the client share.

The command line and the console stand on it side by side and neither imports the other, so a job looks
the same (and is masked the same) whether ``job show`` prints it or the console draws it, and a decision
is made in one place; `agentlife.Client` runs the same operations.

* `_mask.py`: `Masker`, the one way a value from the store or a journal reaches an operator: secrets
  masked (the `Redactor`, then every value under a key named like a credential), size bounded.
* `_view.py`: `read_job_state` (the row, its approval, its wait and the events not yet taken) and
  `show_job` (the same, masked, as the lines both tools show).
* `_approve.py`: `approve_parked`, approving exactly the call a job is parked on.
* `_start.py`: creating a job (`check_start`, `create_job`): ``job create`` and `agentlife.Client.start`.
* `_reason.py`: `check_reason`, the reason of a reject or a cancel.
* `_actor.py`: `check_actor` and `default_actor`, who does an operator action (recorded with it).
* `_cursor.py`: the job list's keyset paging cursor as text, for the console's pages and the client.
* `_rewind.py`: `plan_rewind` and `rewind_job`, ``job rewind`` and `agentlife.Client.rewind`.
* `_actor.py`: `default_actor` and `check_actor`, who performs an operator's action.
"""
