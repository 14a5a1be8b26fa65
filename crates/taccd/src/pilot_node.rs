//! The node side of a Slurm pilot: a `taccd agent` started by a pilot job's batch script
//! (see `tacc_exec::slurm::pilot`) finds its job id, its allocation's end and its
//! partition in the environment and registers with them as labels, so the scheduler
//! places on it only tasks that end before the allocation does.

use anyhow::{Result, bail};
use tacc_core::labels;

/// The pilot's labels, from `TACC_PILOT_JOB`, `TACC_PILOT_ENDS` (Unix seconds) and
/// `TACC_PILOT_PARTITION`; none for an agent that is no pilot.
pub fn labels_from_env() -> Result<Vec<(String, String)>> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    labels_from(
        var("TACC_PILOT_JOB"),
        var("TACC_PILOT_ENDS"),
        var("TACC_PILOT_PARTITION"),
    )
}

fn labels_from(
    job: Option<String>,
    ends: Option<String>,
    partition: Option<String>,
) -> Result<Vec<(String, String)>> {
    let (job, ends) = match (job, ends) {
        (None, None) => return Ok(Vec::new()),
        (Some(job), Some(ends)) => (job.trim().to_string(), ends.trim().to_string()),
        _ => bail!(
            "a pilot agent needs both TACC_PILOT_JOB and TACC_PILOT_ENDS (its Slurm job id and \
             its allocation's end in Unix seconds); unset both to run an ordinary agent"
        ),
    };
    for (name, value) in [("TACC_PILOT_JOB", &job), ("TACC_PILOT_ENDS", &ends)] {
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
            bail!("{name}=`{value}` is not a number; the pilot's batch script sets it");
        }
    }
    let mut pairs = vec![
        (labels::PILOT.to_string(), job),
        (labels::PILOT_ENDS.to_string(), ends),
    ];
    if let Some(partition) = partition {
        pairs.push((labels::SLURM_PARTITION.to_string(), partition));
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::labels_from;

    #[test]
    fn a_pilot_registers_its_job_and_end() {
        assert!(labels_from(None, None, None).unwrap().is_empty());
        let labels = labels_from(
            Some("42".into()),
            Some("1700000000".into()),
            Some("debug".into()),
        )
        .unwrap();
        assert_eq!(labels.len(), 3, "{labels:?}");
        assert!(labels_from(Some("42".into()), None, None).is_err());
        assert!(
            labels_from(Some("42".into()), Some("soon".into()), None)
                .unwrap_err()
                .to_string()
                .contains("not a number")
        );
    }
}
