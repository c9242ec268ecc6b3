"""A run's metrics on their way to its store, one way for every run and every store (issue 33):

- `journal`: every metric row a run makes, appended to its journal on disk first (checksummed
             records, this user's file only), and read back from the last row the store confirmed
- `stores`:  rows into a store: a local SQLite store by plain SQL (on the MLflow schema revisions
             it was tested with), anything else through MLflow's `log_batch`
- `helper`:  the one delivery process of a training process, which reads its runs' journals and
             delivers them; and the training side's handle on it
- `figures`: a run's training-curves figure, which that process draws while the training process
             logs the run's models

`resume=`, a requeued job, the reaper of dead runs and a run's own end deliver a journal with the
same code (`journal.deliver_journal`, `journal.Tail`). Light imports only: the helper process
starts from here, and MLflow loads only where rows go through its client."""
