//! `tacc-schema`: placeholder, filled in by its issue.
