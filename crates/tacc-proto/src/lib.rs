//! `tacc-proto`: placeholder, filled in by its issue.
