//! Size limits of a task file: what the kernel would refuse at launch ("Argument list too
//! long") is refused at submit, located at the field that is too large.

use crate::spec::{Problem, TaskSpec, problem};

/// Bytes of one `environment.vars` value. Linux refuses to start a program with an
/// environment string (`NAME=value`) over 128 KiB ("Argument list too long"); half of it
/// leaves room for the name and what the platform adds.
pub const MAX_VAR_VALUE_BYTES: usize = 64 << 10;
/// Bytes of all `environment.vars` together (`NAME=value` each): a quarter of the usual
/// 2 MiB the kernel allows a program's arguments and environment, the rest being the
/// platform's variables and the task's own arguments.
pub const MAX_VARS_TOTAL_BYTES: usize = 512 << 10;
/// Bytes of `run`, and of `setup`: each is handed to the shell as one argument.
pub const MAX_COMMAND_BYTES: usize = 64 << 10;

/// What would be refused at launch ("Argument list too long") is refused at submit.
pub(crate) fn check_sizes(spec: &TaskSpec) -> Option<Problem> {
    let kib = |bytes: usize| bytes.div_ceil(1024);
    for (field, text) in [("run", Some(&spec.run)), ("setup", spec.setup.as_ref())] {
        if let Some(text) = text
            && text.len() > MAX_COMMAND_BYTES
        {
            return Some(problem(
                field,
                format!(
                    "`{field}` is {} KiB; at most {} KiB are allowed",
                    kib(text.len()),
                    kib(MAX_COMMAND_BYTES)
                ),
                "put the commands in a script in the code directory and run that, e.g. \
                 `run: bash train.sh`",
            ));
        }
    }
    let mut total = 0;
    for (name, value) in &spec.environment.vars {
        if value.len() > MAX_VAR_VALUE_BYTES {
            return Some(problem(
                format!("environment.vars.{name}"),
                format!(
                    "the value of `{name}` is {} KiB; at most {} KiB are allowed",
                    kib(value.len()),
                    kib(MAX_VAR_VALUE_BYTES)
                ),
                "put large values in a file in the code directory and pass its path, e.g. \
                 `CONFIG: config.json`",
            ));
        }
        // `NAME=value` and its terminating NUL, as the kernel counts it.
        total += name.len() + value.len() + 2;
        if total > MAX_VARS_TOTAL_BYTES {
            return Some(problem(
                format!("environment.vars.{name}"),
                format!(
                    "`environment.vars` reach {} KiB here; at most {} KiB are allowed in all",
                    kib(total),
                    kib(MAX_VARS_TOTAL_BYTES)
                ),
                "put large values in files in the code directory and pass their paths",
            ));
        }
    }
    None
}
