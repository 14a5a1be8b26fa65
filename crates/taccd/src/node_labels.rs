//! `taccd agent --label KEY=VALUE`: an operator's own node labels, which task files select
//! with `placement.labels`. Keys under `tacc.io/` are refused: the agent sets those
//! itself from what it really offers (see `tacc_core::labels`).

use tacc_core::labels;

/// One `--label` argument, checked as the task file's `placement.labels` are.
pub fn parse_label(text: &str) -> Result<(String, String), String> {
    let Some((key, value)) = text.split_once('=') else {
        return Err(format!(
            "`{text}` is not a label: write it as KEY=VALUE, e.g. `--label gpu-gen=hopper`"
        ));
    };
    let (key, value) = (key.trim(), value.trim());
    if let Some(why) = labels::key_error(key).or_else(|| labels::value_error(value)) {
        return Err(format!("{why} (write e.g. `--label gpu-gen=hopper`)"));
    }
    if labels::is_reserved(key) {
        return Err(format!(
            "`{key}` is set by the agent itself (keys under `{}` say what the node offers); \
             pick a key of your own, e.g. `--label gpu-gen=hopper`",
            labels::RESERVED_PREFIX
        ));
    }
    Ok((key.to_string(), value.to_string()))
}

#[cfg(test)]
mod tests {
    use super::parse_label;

    #[test]
    fn labels_are_key_value_pairs_outside_the_platform_prefix() {
        assert_eq!(
            parse_label("gpu-gen=hopper"),
            Ok(("gpu-gen".to_string(), "hopper".to_string()))
        );
        assert_eq!(
            parse_label("example.org/rack=r7"),
            Ok(("example.org/rack".to_string(), "r7".to_string()))
        );
        assert!(parse_label("gpu-gen").unwrap_err().contains("KEY=VALUE"));
        assert!(parse_label("gpu-gen=").unwrap_err().contains("empty"));
        assert!(parse_label("gpu gen=x").unwrap_err().contains("` `"));
        assert!(parse_label("a=b=c").unwrap_err().contains("`=`"));
        assert!(
            parse_label("tacc.io/runtime.slurm=true")
                .unwrap_err()
                .contains("set by the agent itself")
        );
    }
}
