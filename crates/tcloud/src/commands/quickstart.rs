//! `tcloud quickstart`: a starter project that runs anywhere Python 3 does.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};

use crate::errors::CliError;
use crate::format::out;

/// The starter project is the repository's own `examples/quickstart`, so what users get
/// is exactly what the README's first command runs and the tests check.
pub const TASK_YAML: &str = include_str!("../../../../examples/quickstart/task.yaml");
pub const TRAIN_PY: &str = include_str!("../../../../examples/quickstart/train.py");

pub fn quickstart(dir: &Path) -> Result<()> {
    let files = [("task.yaml", TASK_YAML), ("train.py", TRAIN_PY)];
    let existing: Vec<String> = files
        .iter()
        .map(|(name, _)| dir.join(name))
        .filter(|path| path.exists())
        .map(|path| path.display().to_string())
        .collect();
    if !existing.is_empty() {
        return Err(CliError::invalid(format!(
            "refusing to overwrite {}; pick another directory with `tcloud quickstart DIR`",
            existing.join(" and ")
        ))
        .into());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for (name, text) in files {
        let path = dir.join(name);
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        file.write_all(text.as_bytes())
            .with_context(|| format!("cannot write {}", path.display()))?;
        out(format!("wrote {}", path.display()))?;
    }
    let shown = dir.display();
    out("")?;
    out("Next:")?;
    out("  tcloud up                      # start a cluster on this machine")?;
    out(format!("  tcloud check {shown}"))?;
    out(format!(
        "  tcloud submit {shown} -f       # run it and stream its log"
    ))?;
    out("  tcloud download ID             # fetch results/metrics.json")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starter_task_file_is_valid_and_files_are_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().join("qs");
        quickstart(&project).unwrap();
        let task = tacc_schema::load_task(&project).unwrap();
        assert_eq!(task.spec.name, "quickstart");
        assert_eq!(task.spec.outputs, vec!["results/".to_string()]);
        assert!(task.warnings.is_empty());
        let err = quickstart(&project).unwrap_err().to_string();
        assert!(err.contains("refusing to overwrite"), "{err}");
    }
}
