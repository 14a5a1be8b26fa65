//! `tacc-agent`: placeholder, filled in by its issue.
