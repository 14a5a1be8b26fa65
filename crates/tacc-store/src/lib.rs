//! `tacc-store`: placeholder, filled in by its issue.
