//! Reading what Slurm says: job states (`squeue`) and node capacity (`sinfo`), from JSON
//! where this Slurm offers it and from fixed-format text otherwise. Both parsers are
//! lenient: unknown fields are ignored, a malformed line or job is skipped.

use serde_json::Value;

/// The fields TACC needs of one Slurm job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobStatus {
    pub job_id: u64,
    /// Slurm's state name, upper case (`PENDING`, `RUNNING`, `NODE_FAIL`, …).
    pub state: String,
    /// Slurm's reason (`Resources`, `Priority`, `NonZeroExitCode`, `None`, …).
    pub reason: String,
    pub comment: String,
    /// The job's exit code when Slurm reports it (JSON output only).
    pub exit_code: Option<i32>,
    pub nodes: String,
}

/// Text format for `squeue -h -o`: fields Slurm cannot put a `|` into come first,
/// the free-text comment last.
pub const SQUEUE_TEXT_FORMAT: &str = "%i|%T|%r|%N|%k";

pub fn parse_squeue_text(text: &str) -> Vec<JobStatus> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.trim_end().splitn(5, '|');
            let job_id = fields.next()?.trim().parse().ok()?;
            let state = fields.next()?.trim().to_ascii_uppercase();
            let reason = fields.next().unwrap_or("").trim().to_string();
            let nodes = fields.next().unwrap_or("").trim().to_string();
            let comment = fields.next().unwrap_or("").trim().to_string();
            Some(JobStatus {
                job_id,
                state,
                reason,
                comment: if comment == "(null)" {
                    String::new()
                } else {
                    comment
                },
                exit_code: None,
                nodes,
            })
        })
        .collect()
}

/// `squeue --json` (OpenAPI v0.0.38 and later: `job_state` may be a string or a list,
/// `exit_code` a raw wait status or an object).
pub fn parse_squeue_json(text: &str) -> Option<Vec<JobStatus>> {
    let value: Value = serde_json::from_str(text).ok()?;
    let jobs = value.get("jobs")?.as_array()?;
    Some(
        jobs.iter()
            .filter_map(|job| {
                let job_id = job.get("job_id")?.as_u64()?;
                let state = match job.get("job_state")? {
                    Value::String(s) => s.clone(),
                    Value::Array(states) => states.first()?.as_str()?.to_string(),
                    _ => return None,
                }
                .to_ascii_uppercase();
                Some(JobStatus {
                    job_id,
                    state,
                    reason: string_field(job, "state_reason"),
                    comment: string_field(job, "comment"),
                    exit_code: job.get("exit_code").and_then(exit_code_of),
                    nodes: string_field(job, "nodes"),
                })
            })
            .collect(),
    )
}

fn string_field(value: &Value, name: &str) -> String {
    value
        .get(name)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

fn exit_code_of(value: &Value) -> Option<i32> {
    match value {
        // v0.0.38: the raw wait status (code << 8 | signal).
        Value::Number(n) => {
            let raw = n.as_i64()?;
            Some(((raw >> 8) & 0xff) as i32)
        }
        // Later versions: {"status": [...], "return_code": {"number": 3, "set": true}}.
        Value::Object(_) => match value.get("return_code")? {
            Value::Number(n) => n.as_i64().map(|n| n as i32),
            rc => rc.get("number")?.as_i64().map(|n| n as i32),
        },
        _ => None,
    }
}

/// What a job's state means for TACC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobPhase {
    /// Not started yet; the reason says why (Slurm's pending reason).
    Pending,
    Running,
    /// Ended by itself: use the exit codes.
    Completed,
    Cancelled,
    TimeLimit,
    /// Ended for a reason outside the task: the snake_case reason and Slurm's state.
    Infrastructure(&'static str),
}

/// Map a Slurm state name to a [`JobPhase`]. Unknown states count as running while
/// Slurm still lists them, so a new Slurm state never ends a task by mistake.
pub fn phase_of(state: &str) -> JobPhase {
    match state {
        "PENDING" | "REQUEUED" | "REQUEUE_FED" | "REQUEUE_HOLD" | "RESV_DEL_HOLD"
        | "CONFIGURING" | "SPECIAL_EXIT" => JobPhase::Pending,
        "RUNNING" | "COMPLETING" | "SUSPENDED" | "STOPPED" | "SIGNALING" | "STAGE_OUT"
        | "RESIZING" => JobPhase::Running,
        "COMPLETED" | "FAILED" => JobPhase::Completed,
        "CANCELLED" | "REVOKED" => JobPhase::Cancelled,
        "TIMEOUT" | "DEADLINE" => JobPhase::TimeLimit,
        "NODE_FAIL" | "BOOT_FAIL" => JobPhase::Infrastructure("node_failure"),
        "PREEMPTED" => JobPhase::Infrastructure("preempted"),
        "OUT_OF_MEMORY" => JobPhase::Infrastructure("out_of_memory"),
        _ => JobPhase::Running,
    }
}

/// One Slurm node as `sinfo` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmNode {
    pub name: String,
    pub cpus: u64,
    pub memory_mb: u64,
    pub gpus: u32,
    pub gpu_type: Option<String>,
    pub partitions: Vec<String>,
    pub state: String,
}

/// Text format for `sinfo -h -N -o`.
pub const SINFO_TEXT_FORMAT: &str = "%N|%c|%m|%G|%P|%t";

pub fn parse_sinfo_text(text: &str) -> Vec<SlurmNode> {
    let mut nodes: Vec<SlurmNode> = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.trim().split('|').collect();
        if fields.len() < 6 {
            continue;
        }
        let Ok(cpus) = fields[1].trim().parse() else {
            continue;
        };
        let memory_mb = fields[2].trim().trim_end_matches('+').parse().unwrap_or(0);
        let (gpus, gpu_type) = parse_gres(fields[3]);
        let partition = fields[4].trim().trim_end_matches('*').to_string();
        // `sinfo -N` lists a node once per partition.
        if let Some(node) = nodes.iter_mut().find(|n| n.name == fields[0].trim()) {
            if !node.partitions.contains(&partition) {
                node.partitions.push(partition);
            }
            continue;
        }
        nodes.push(SlurmNode {
            name: fields[0].trim().to_string(),
            cpus,
            memory_mb,
            gpus,
            gpu_type,
            partitions: vec![partition],
            state: fields[5].trim().to_string(),
        });
    }
    nodes
}

pub fn parse_sinfo_json(text: &str) -> Option<Vec<SlurmNode>> {
    let value: Value = serde_json::from_str(text).ok()?;
    let nodes = value.get("nodes")?.as_array()?;
    Some(
        nodes
            .iter()
            .filter_map(|node| {
                let name = node.get("name")?.as_str()?.to_string();
                let (gpus, gpu_type) = parse_gres(node.get("gres").and_then(Value::as_str)?);
                let state = match node.get("state") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(states)) => states
                        .iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join("+"),
                    _ => String::new(),
                };
                Some(SlurmNode {
                    name,
                    cpus: node.get("cpus")?.as_u64()?,
                    memory_mb: node.get("real_memory").and_then(Value::as_u64).unwrap_or(0),
                    gpus,
                    gpu_type,
                    partitions: node
                        .get("partitions")
                        .and_then(Value::as_array)
                        .map(|p| {
                            p.iter()
                                .filter_map(Value::as_str)
                                .map(str::to_string)
                                .collect()
                        })
                        .unwrap_or_default(),
                    state: state.to_ascii_lowercase(),
                })
            })
            .collect(),
    )
}

/// `gpu:4`, `gpu:a100:4(S:0-1)`, `gpu:a100:2,shard:8`, `(null)` → count and type.
/// Slurm's default partition from `sinfo -h -o %P` (one partition a line, the default
/// marked with `*`), if it names one.
pub fn default_partition(text: &str) -> Option<String> {
    text.lines()
        .map(str::trim)
        .find_map(|line| line.strip_suffix('*'))
        .filter(|name| !name.is_empty())
        .map(str::to_string)
}

pub fn parse_gres(gres: &str) -> (u32, Option<String>) {
    let mut count = 0;
    let mut kind = None;
    for item in gres.split(',') {
        let item = item.split('(').next().unwrap_or("").trim();
        let parts: Vec<&str> = item.split(':').collect();
        if parts.first() != Some(&"gpu") {
            continue;
        }
        match parts.as_slice() {
            [_, n] => count += n.parse::<u32>().unwrap_or(0),
            [_, t, n] => {
                count += n.parse::<u32>().unwrap_or(0);
                kind.get_or_insert_with(|| t.to_ascii_uppercase());
            }
            _ => {}
        }
    }
    (count, kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_partition_is_the_starred_one() {
        assert_eq!(
            default_partition("gpu\ndebug*\nlong\n"),
            Some("debug".to_string())
        );
        assert_eq!(default_partition("gpu\nlong\n"), None);
        assert_eq!(default_partition(""), None);
    }

    #[test]
    fn squeue_text_keeps_pipes_in_the_comment_and_skips_garbage() {
        let jobs = parse_squeue_text(
            "12|RUNNING|None|tacc-n1|tacc:ci/3-1-run\nnot a job\n13|PENDING|Resources||(null)\n",
        );
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0].comment, "tacc:ci/3-1-run");
        assert_eq!(jobs[0].nodes, "tacc-n1");
        assert_eq!(jobs[1].reason, "Resources");
        assert_eq!(jobs[1].comment, "");
    }

    #[test]
    fn squeue_json_v0038_and_later_shapes() {
        let old = r#"{"meta":{},"jobs":[{"job_id":3,"job_state":"FAILED","state_reason":"NonZeroExitCode","comment":"c","exit_code":768,"nodes":"n1","unknown":{"x":1}}]}"#;
        let jobs = parse_squeue_json(old).unwrap();
        assert_eq!(jobs[0].exit_code, Some(3));
        assert_eq!(jobs[0].state, "FAILED");
        let new = r#"{"jobs":[{"job_id":4,"job_state":["TIMEOUT"],"exit_code":{"status":["ERROR"],"return_code":{"number":1,"set":true}}}]}"#;
        let jobs = parse_squeue_json(new).unwrap();
        assert_eq!(jobs[0].state, "TIMEOUT");
        assert_eq!(jobs[0].exit_code, Some(1));
        assert!(parse_squeue_json("squeue: error").is_none());
    }

    #[test]
    fn states_map_with_their_reasons() {
        assert_eq!(phase_of("PENDING"), JobPhase::Pending);
        assert_eq!(phase_of("COMPLETING"), JobPhase::Running);
        assert_eq!(phase_of("TIMEOUT"), JobPhase::TimeLimit);
        assert_eq!(
            phase_of("NODE_FAIL"),
            JobPhase::Infrastructure("node_failure")
        );
        assert_eq!(phase_of("PREEMPTED"), JobPhase::Infrastructure("preempted"));
        assert_eq!(
            phase_of("OUT_OF_MEMORY"),
            JobPhase::Infrastructure("out_of_memory")
        );
        assert_eq!(phase_of("SOMETHING_NEW"), JobPhase::Running);
    }

    #[test]
    fn sinfo_text_and_json() {
        let nodes = parse_sinfo_text(
            "gpu1|64|256000|gpu:a100:4(S:0-1)|gpu*|idle\ngpu1|64|256000|gpu:a100:4(S:0-1)|all|idle\ncpu1|8|16000|(null)|all|mix\n",
        );
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0].gpus, 4);
        assert_eq!(nodes[0].gpu_type.as_deref(), Some("A100"));
        assert_eq!(nodes[0].partitions, vec!["gpu", "all"]);
        assert_eq!(nodes[1].gpus, 0);
        let json = r#"{"nodes":[{"name":"n1","cpus":2,"real_memory":8035,"gres":"gpu:2","partitions":["debug"],"state":"idle","new_field":[]}]}"#;
        let nodes = parse_sinfo_json(json).unwrap();
        assert_eq!(nodes[0].cpus, 2);
        assert_eq!(nodes[0].gpus, 2);
        assert_eq!(nodes[0].memory_mb, 8035);
    }
}
