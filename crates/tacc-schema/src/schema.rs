//! The task file's JSON Schema, generated from the spec types so it cannot drift from them.

use crate::TaskSpec;

/// JSON Schema (draft 2020-12) of the task file, for editors and for checking JSON specs.
pub fn json_schema() -> serde_json::Value {
    schemars::schema_for!(TaskSpec).to_value()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader;

    const COMMITTED_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/task.schema.json");

    fn rendered() -> String {
        let mut text = serde_json::to_string_pretty(&json_schema()).unwrap();
        text.push('\n');
        text
    }

    #[test]
    fn committed_schema_file_is_up_to_date() {
        let generated = rendered();
        if std::env::var_os("TACC_UPDATE_SCHEMA").is_some() {
            std::fs::write(COMMITTED_PATH, &generated).unwrap();
            return;
        }
        let committed = std::fs::read_to_string(COMMITTED_PATH).unwrap_or_default();
        assert!(
            committed == generated,
            "crates/tacc-schema/task.schema.json is out of date with the spec types; \
             regenerate it with `TACC_UPDATE_SCHEMA=1 cargo test -p tacc-schema` and commit it"
        );
    }

    fn properties<'v>(schema: &'v serde_json::Value, pointer: &str) -> Vec<&'v str> {
        let mut names: Vec<&str> = schema
            .pointer(pointer)
            .and_then(|value| value.as_object())
            .unwrap_or_else(|| panic!("no properties at {pointer}"))
            .keys()
            .map(String::as_str)
            .collect();
        names.sort_unstable();
        names
    }

    fn sorted<'a>(fields: &[&'a str]) -> Vec<&'a str> {
        let mut fields = fields.to_vec();
        fields.sort_unstable();
        fields
    }

    /// The YAML reader keeps its own field lists (for did-you-mean); they must match the types.
    #[test]
    fn reader_field_lists_match_the_schema() {
        let schema = json_schema();
        let cases: [(&str, &[&str]); 9] = [
            ("/properties", reader::TASK_FIELDS),
            ("/$defs/ResourceSpec/properties", reader::RESOURCE_FIELDS),
            ("/$defs/CodeSpec/properties", reader::CODE_FIELDS),
            (
                "/$defs/EnvironmentSpec/properties",
                reader::ENVIRONMENT_FIELDS,
            ),
            ("/$defs/CondaSpec/properties", reader::CONDA_FIELDS),
            ("/$defs/DatasetSpec/properties", reader::DATASET_FIELDS),
            ("/$defs/RetrySpec/properties", reader::RETRY_FIELDS),
            (
                "/$defs/CheckpointSpec/properties",
                reader::CHECKPOINT_FIELDS,
            ),
            ("/$defs/PlacementSpec/properties", reader::PLACEMENT_FIELDS),
        ];
        for (pointer, fields) in cases {
            assert_eq!(properties(&schema, pointer), sorted(fields), "{pointer}");
        }
    }

    #[test]
    fn schema_requires_run_and_rejects_unknown_fields() {
        let schema = json_schema();
        assert_eq!(schema["required"], serde_json::json!(["run"]));
        assert_eq!(schema["additionalProperties"], serde_json::json!(false));
        assert_eq!(
            schema["$defs"]["ResourceSpec"]["properties"]["memory"]["default"],
            serde_json::json!("1GiB")
        );
    }
}
