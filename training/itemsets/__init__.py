"""Item sets: the team's own tasks as training and evaluation items (uploaded files, logged tasks,
reviewers' verdicts), versioned and split once; the bundled replay benchmark is one set among them.

- `rows`: reading an uploaded file (JSON Lines or CSV) into checked rows, every refusal with its line;
- `selectors`: the items of a set's split, for rollouts, evaluations and jobs, and each worker's
  outcome on them from the record;
- `services`: uploads, adding logged tasks, freezing a version, export; each one transaction with its
  audit event;
- `views`, `api`, `urls`, `forms`: the pages and the API.
"""
