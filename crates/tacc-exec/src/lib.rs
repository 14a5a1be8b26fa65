//! `tacc-exec`: placeholder, filled in by its issue.
