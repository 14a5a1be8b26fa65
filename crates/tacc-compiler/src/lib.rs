//! `tacc-compiler`: placeholder, filled in by its issue.
