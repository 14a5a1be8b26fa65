//! `tcloud quickstart`: a starter project that runs anywhere Python 3 does.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};

use crate::errors::CliError;
use crate::format::out;

pub const TASK_YAML: &str = r#"# A TACC task file: what to run, on how much of the cluster.
# Check it with `tcloud check`, run it with `tcloud submit . -f`.
name: quickstart-logreg

resources:            # per node
  nodes: 1            # more than 1 makes a gang: all nodes start together or not at all
  cpus: 1             # fractions work too, e.g. 0.5
  memory: 512MiB
  gpus: 0             # e.g. 1 (and optionally `gpu_type: A100`)
  time_limit: 10m     # the task is stopped if it runs longer

code:
  dir: .                     # shipped to the nodes; only changed files are uploaded again
  exclude: ["results/"]      # .gitignore and .taccignore are honoured as well

environment:
  vars:
    EPOCHS: "30"
# environment:               # other options:
#   pip: ["numpy==2.1.*"]    #   packages, installed once and cached
#   image: python:3.12-slim  #   run in a container instead

run: python3 train.py

outputs:                     # kept after the task ends: `tcloud download ID`
  - results/
"#;

pub const TRAIN_PY: &str = r#""""Logistic regression on generated data, with nothing but the standard library.

Prints the loss every epoch and writes results/metrics.json, which the task file lists
under `outputs:` so `tcloud download ID` fetches it.
"""

import json
import math
import os
import random

SEED = 7
EPOCHS = int(os.environ.get("EPOCHS", "30"))
LEARNING_RATE = 0.5
FEATURES = 4
SAMPLES = 2000


def make_data(rng):
    """Points labelled by a hidden linear rule, with some noise."""
    true_w = [rng.uniform(-2, 2) for _ in range(FEATURES)]
    data = []
    for _ in range(SAMPLES):
        x = [rng.gauss(0, 1) for _ in range(FEATURES)]
        z = sum(w * xi for w, xi in zip(true_w, x)) + rng.gauss(0, 0.3)
        data.append((x, 1 if z > 0 else 0))
    return data


def sigmoid(z):
    if z >= 0:
        return 1 / (1 + math.exp(-z))
    e = math.exp(z)
    return e / (1 + e)


def main():
    rng = random.Random(SEED)
    data = make_data(rng)
    split = int(0.8 * len(data))
    train, test = data[:split], data[split:]
    w, b = [0.0] * FEATURES, 0.0
    print(f"task {os.environ.get('TACC_TASK_ID', '?')}, attempt {os.environ.get('TACC_ATTEMPT', '?')}: "
          f"{len(train)} training points, {EPOCHS} epochs", flush=True)
    for epoch in range(1, EPOCHS + 1):
        grad_w, grad_b, loss = [0.0] * FEATURES, 0.0, 0.0
        for x, y in train:
            p = sigmoid(sum(wi * xi for wi, xi in zip(w, x)) + b)
            loss -= y * math.log(p + 1e-12) + (1 - y) * math.log(1 - p + 1e-12)
            for i in range(FEATURES):
                grad_w[i] += (p - y) * x[i]
            grad_b += p - y
        n = len(train)
        w = [wi - LEARNING_RATE * g / n for wi, g in zip(w, grad_w)]
        b -= LEARNING_RATE * grad_b / n
        print(f"epoch {epoch:3d}  loss {loss / n:.4f}", flush=True)
    correct = sum(
        1 for x, y in test if (sigmoid(sum(wi * xi for wi, xi in zip(w, x)) + b) > 0.5) == (y == 1)
    )
    accuracy = correct / len(test)
    print(f"test accuracy {accuracy:.3f}", flush=True)
    os.makedirs("results", exist_ok=True)
    with open(os.path.join("results", "metrics.json"), "w") as f:
        json.dump({"epochs": EPOCHS, "final_loss": loss / n, "test_accuracy": accuracy,
                   "weights": w, "bias": b}, f, indent=2)
    print("wrote results/metrics.json", flush=True)


if __name__ == "__main__":
    main()
"#;

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
        assert_eq!(task.spec.name, "quickstart-logreg");
        assert_eq!(task.spec.outputs, vec!["results/".to_string()]);
        assert!(task.warnings.is_empty());
        let err = quickstart(&project).unwrap_err().to_string();
        assert!(err.contains("refusing to overwrite"), "{err}");
    }
}
