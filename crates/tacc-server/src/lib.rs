//! `tacc-server`: placeholder, filled in by its issue.
