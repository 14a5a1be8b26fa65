//! The OpenAPI 3.1 description of the HTTP API (`GET /v1/openapi.json`), built with
//! `utoipa` from the wire types' own schemas (`tacc-proto`'s `openapi` feature derives
//! them) and one line per route in [`described`]: what it takes and what it answers. A
//! route of the route table without a line here (or a line without a route) fails the
//! tests, as does a path parameter the description does not declare.

use std::collections::BTreeMap;

use axum::http::Method;
use tacc_proto::*;
use utoipa::ToSchema;
use utoipa::openapi::path::{HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, SchemaType, Type};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{
    ComponentsBuilder, ContentBuilder, InfoBuilder, OpenApi, OpenApiBuilder, Paths, Ref, RefOr,
    Required, ResponseBuilder, Schema,
};

use super::{RouteRule, route_rules};
use crate::auth::Access;

/// Schemas a body refers to: the reference (or inline schema) and the named schemas it
/// needs among the components.
type Described = (RefOr<Schema>, Vec<(String, RefOr<Schema>)>);

/// A JSON body of wire type `T`.
fn one<T: ToSchema>() -> Described {
    let mut needed = vec![(T::name().into_owned(), T::schema())];
    T::schemas(&mut needed);
    (Ref::from_schema_name(T::name()).into(), needed)
}

/// A JSON array of `T`.
fn many<T: ToSchema>() -> Described {
    let (item, needed) = one::<T>();
    (ArrayBuilder::new().items(item).build().into(), needed)
}

/// Any JSON value (documents the server passes through: manifests, instructions).
fn any_json() -> Described {
    (
        Schema::Object(
            ObjectBuilder::new()
                .schema_type(SchemaType::AnyValue)
                .build(),
        )
        .into(),
        Vec::new(),
    )
}

fn text() -> Described {
    (
        Schema::Object(ObjectBuilder::new().schema_type(Type::String).build()).into(),
        Vec::new(),
    )
}

/// What a request or response carries.
#[derive(Clone, Copy)]
enum Body {
    None,
    Json(fn() -> Described),
    /// Raw bytes or text of this content type.
    Raw(&'static str, fn() -> Described),
}

/// One query parameter: name, JSON type, description.
type QueryParam = (&'static str, Type, &'static str);

/// What the description says of one route.
struct Operation {
    method: Method,
    path: &'static str,
    summary: &'static str,
    query: &'static [QueryParam],
    request: Body,
    /// The status of success.
    status: u16,
    response: Body,
    /// Takes an `Idempotency-Key` header (exactly-once submit, cancel, rerun).
    keyed: bool,
}

fn op(method: Method, path: &'static str, summary: &'static str) -> Operation {
    Operation {
        method,
        path,
        summary,
        query: &[],
        request: Body::None,
        status: 200,
        response: Body::None,
        keyed: false,
    }
}

impl Operation {
    fn takes(mut self, body: Body) -> Self {
        self.request = body;
        self
    }
    fn answers(mut self, status: u16, body: Body) -> Self {
        self.status = status;
        self.response = body;
        self
    }
    fn query(mut self, query: &'static [QueryParam]) -> Self {
        self.query = query;
        self
    }
    fn keyed(mut self) -> Self {
        self.keyed = true;
        self
    }
}

const BYTES: &str = "application/octet-stream";

/// Every route of the API as described: keep in step with `declare` in `api/mod.rs`.
fn described() -> Vec<Operation> {
    use Body::{Json, Raw};
    use Method as M;
    let bytes = || -> Described {
        (
            Schema::Object(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .content_media_type(BYTES)
                    .build(),
            )
            .into(),
            Vec::new(),
        )
    };
    let tasks_query: &'static [QueryParam] = &[
        (
            "state",
            Type::String,
            "Comma-separated task states to list (all when absent).",
        ),
        ("user", Type::String, "Only this user's tasks."),
        ("limit", Type::Integer, "Newest tasks listed at most."),
        (
            "ungrouped",
            Type::Boolean,
            "Only tasks that are no group's element (groups are listed by `/v1/groups`).",
        ),
    ];
    let files_query: &'static [QueryParam] = &[
        (
            "path",
            Type::String,
            "Relative to the working directory; empty for its root.",
        ),
        (
            "rank",
            Type::Integer,
            "The node rank to ask (0 when absent), or whose kept outputs to list.",
        ),
        (
            "attempt",
            Type::Integer,
            "An earlier attempt's kept outputs instead of the running attempt's live files.",
        ),
    ];
    vec![
        op(
            M::GET,
            "/v1/health",
            "Whether the server answers, and its version.",
        )
        .answers(200, Json(one::<Health>)),
        op(M::GET, "/v1/openapi.json", "This description of the API.").answers(200, Json(any_json)),
        op(
            M::GET,
            "/v1/whoami",
            "The identity the presented token stands for.",
        )
        .answers(200, Json(one::<WhoAmI>)),
        op(
            M::GET,
            "/metrics",
            "The server's metrics in the Prometheus text format (a scrape token or an admin).",
        )
        .answers(200, Raw("text/plain; version=0.0.4", text)),
        op(
            M::POST,
            "/v1/tasks",
            "Submit a task (durable before the answer).",
        )
        .takes(Json(one::<SubmitTask>))
        .answers(201, Json(one::<SubmitReply>))
        .keyed(),
        op(
            M::POST,
            "/v1/estimate",
            "When a task with this spec would start here if submitted now (nothing is stored).",
        )
        .takes(Json(one::<tacc_proto::EstimateQuery>))
        .answers(200, Json(one::<tacc_proto::SubmitEstimate>)),
        op(
            M::GET,
            "/v1/tasks",
            "List the tasks the caller may see, newest first.",
        )
        .query(tasks_query)
        .answers(200, Json(many::<TaskView>)),
        op(M::GET, "/v1/tasks/{id}", "One task.").answers(200, Json(one::<TaskView>)),
        op(
            M::GET,
            "/v1/groups",
            "The task groups (arrays) the caller may see, newest first, each with its elements \
             counted by state: those with unfinished elements and the latest ones.",
        )
        .query(&[
            ("all", Type::Boolean, "Every group, not only the unfinished and the latest."),
            ("user", Type::String, "Only this user's groups (group admins and admins)."),
            ("limit", Type::Integer, "Latest groups listed at most (20 when absent)."),
        ])
        .answers(200, Json(many::<GroupView>)),
        op(
            M::GET,
            "/v1/groups/{id}",
            "One task group and every element, by index.",
        )
        .query(&[
            (
                "elements",
                Type::Boolean,
                "`false`: the group's counts only, no elements (for pollers of big groups).",
            ),
            (
                "wait_ms",
                Type::Integer,
                "Answer once no element is queued, starting or running, or after this many                  milliseconds (30,000 at most), whichever comes first: a follower hears of                  the last end at once.",
            ),
        ])
        .answers(200, Json(one::<GroupDetail>)),
        op(
            M::GET,
            "/v1/groups/{id}/sweep",
            "A sweep's leaderboard: its trials best first, with their parameters and the best \
             and last reported value of the metric, and the best succeeded trial.",
        )
        .answers(200, Json(one::<tacc_proto::SweepBoard>)),
        op(
            M::POST,
            "/v1/groups/{id}/cancel",
            "Cancel every unfinished element of a group.",
        )
        .answers(200, Json(one::<GroupCancelReply>)),
        op(
            M::POST,
            "/v1/groups/{id}/rerun",
            "Submit again, as a new group with the same indices, the elements that failed, \
             were cancelled or were lost.",
        )
        .takes(Json(one::<GroupRerun>))
        .answers(201, Json(one::<SubmitReply>)),
        op(
            M::POST,
            "/v1/pipelines",
            "Submit a pipeline: every stage (its spec, needs and code snapshot) in one \
             request, made durable in one transaction as a `pipeline` group; stages unchanged \
             since a succeeded run are `cached`.",
        )
        .takes(Json(one::<SubmitPipeline>))
        .answers(201, Json(one::<PipelineSubmitted>))
        .keyed(),
        op(
            M::GET,
            "/v1/history",
            "Ended tasks the caller may see, newest end first, a page at a time.",
        )
        .query(&[
            ("name", Type::String, "Only tasks of this name."),
            ("state", Type::String, "Comma-separated end states (all when absent)."),
            ("since", Type::Integer, "Ended at or after this time, in ms since the epoch."),
            ("user", Type::String, "Only this user's tasks (group admins and admins)."),
            ("before", Type::String, "The `next` of the previous page."),
            ("limit", Type::Integer, "Tasks per page (50 when absent, at most 500)."),
        ])
        .answers(200, Json(one::<HistoryPage>)),
        op(
            M::GET,
            "/v1/usage",
            "Allocated CPU-, GPU- and memory-hours by user or group in a window, like \
             `sreport` (a user sees their own, a group admin their group's, an admin all).",
        )
        .query(&[
            (
                "since",
                Type::String,
                "Start (inclusive): RFC 3339, a date, `now`, or a duration ago (`7d`); 7 days ago when absent.",
            ),
            ("until", Type::String, "End (exclusive), in the same forms; now when absent."),
            ("user", Type::String, "Only this user."),
            ("group", Type::String, "Only this group."),
            ("by", Type::String, "`user` (default) or `group`."),
        ])
        .answers(200, Json(one::<UsageReport>)),
        op(
            M::GET,
            "/v1/usage/fairshare",
            "The fair-share standing of the users and groups the caller may see, like `sshare`.",
        )
        .answers(200, Json(one::<FairShareReport>)),
        op(
            M::GET,
            "/v1/tasks/{id}/events",
            "A task's state transitions, oldest first.",
        )
        .answers(200, Json(many::<TaskEventView>)),
        op(
            M::POST,
            "/v1/tasks/{id}/cancel",
            "Cancel a task (queued ones at once, running ones when their agents confirm).",
        )
        .answers(200, Json(one::<CancelReply>))
        .keyed(),
        op(
            M::GET,
            "/v1/tasks/{id}/logs",
            "A task's log from a byte offset; with `follow`, streamed until the task ended. \
             The `x-tacc-log-offset` header says where the returned bytes end. The file is \
             streamed in bounded steps, however large it is.",
        )
        .query(&[
            ("offset", Type::Integer, "Byte offset to read from."),
            (
                "limit",
                Type::Integer,
                "Without `follow`: at most this many bytes (default: to the current end).",
            ),
            (
                "follow",
                Type::Boolean,
                "Stream new output until the task has ended.",
            ),
        ])
        .answers(200, Raw("text/plain", text)),
        op(
            M::GET,
            "/v1/tasks/{id}/instruction",
            "The compiled instruction of a task (what each node runs).",
        )
        .answers(200, Json(any_json)),
        op(
            M::GET,
            "/v1/tasks/{id}/why",
            "Why a task is where it is: pending reason, queue position, estimated start.",
        )
        .answers(200, Json(one::<TaskExplanation>)),
        op(
            M::GET,
            "/v1/tasks/{id}/usage",
            "What a task's ranks use now, their peaks, and what looks wrong.",
        )
        .answers(200, Json(one::<TaskUsage>)),
        op(
            M::POST,
            "/v1/tasks/{id}/rerun",
            "Submit a task's stored spec and snapshot again as a new task.",
        )
        .answers(201, Json(one::<SubmitReply>))
        .keyed(),
        op(
            M::GET,
            "/v1/tasks/{id}/outputs",
            "The output files a task's attempts kept. `x-tacc-outputs-pending` names ranks \
             that have not reported yet.",
        )
        .answers(200, Json(many::<OutputFile>)),
        op(
            M::GET,
            "/v1/tasks/{id}/outputs/{attempt}/{path}",
            "One kept output file.",
        )
        .query(&[(
            "rank",
            Type::Integer,
            "The rank whose file is wanted (0 when absent).",
        )])
        .answers(200, Raw(BYTES, bytes)),
        op(
            M::GET,
            "/v1/tasks/{id}/files",
            "List a running task's working directory (asked of its node), or kept outputs.",
        )
        .query(files_query)
        .answers(200, Json(one::<FileListing>)),
        op(
            M::GET,
            "/v1/tasks/{id}/files/content",
            "One file of a running task's working directory (asked of its node), or a kept output.",
        )
        .query(files_query)
        .answers(200, Raw(BYTES, bytes)),
        op(
            M::GET,
            "/v1/tasks/{id}/session",
            "Open an interactive session into a running task (`tcloud exec`, `shell`, \
             `port-forward`): an HTTP/1.1 upgrade (`Upgrade: tacc-session`) answered 101 \
             once the task's node has connected back; then session frames both ways.",
        )
        .query(&[
            (
                "rank",
                Type::Integer,
                "The node rank to enter (0 when absent).",
            ),
            (
                "request",
                Type::String,
                "JSON: `{\"kind\":\"exec\",\"command\":[…],\"tty\":{\"rows\":R,\"cols\":C}}` \
                 or `{\"kind\":\"forward\",\"port\":P}`.",
            ),
        ])
        .answers(101, Body::None),
        op(
            M::POST,
            "/v1/snapshots/offer",
            "Offer a snapshot manifest; the answer lists the chunks the server lacks.",
        )
        .takes(Json(one::<SnapshotOffer>))
        .answers(200, Json(one::<SnapshotOfferReply>)),
        op(
            M::POST,
            "/v1/snapshots/commit",
            "Record a snapshot once every chunk is uploaded.",
        )
        .takes(Json(one::<SnapshotOffer>))
        .answers(200, Json(one::<SnapshotCommitted>)),
        op(M::GET, "/v1/snapshots/{id}", "A snapshot's manifest.").answers(200, Json(any_json)),
        op(
            M::PUT,
            "/v1/chunks/{hash}",
            "Upload one chunk (zstd-compressed), verified against its BLAKE3 name.",
        )
        .takes(Raw(BYTES, bytes))
        .answers(204, Body::None),
        op(
            M::GET,
            "/v1/chunks/{hash}",
            "One chunk (for agents materialising a snapshot).",
        )
        .answers(200, Raw(BYTES, bytes)),
        op(
            M::GET,
            "/v1/datasets",
            "Datasets an administrator registered.",
        )
        .answers(200, Json(many::<DatasetView>)),
        op(M::GET, "/v1/nodes", "Every node, like `sinfo`.").answers(200, Json(many::<NodeView>)),
        op(
            M::GET,
            "/v1/secrets",
            "The caller's secrets, by name (never their values).",
        )
        .answers(200, Json(many::<SecretView>)),
        op(
            M::PUT,
            "/v1/secrets/{name}",
            "Set a secret: the raw value is the body.",
        )
        .takes(Raw(BYTES, bytes))
        .answers(204, Body::None),
        op(M::DELETE, "/v1/secrets/{name}", "Delete a secret.").answers(204, Body::None),
        op(
            M::POST,
            "/v1/admin/gc",
            "Run a chunk garbage-collection pass now.",
        )
        .answers(200, Json(one::<GcReport>)),
        op(
            M::POST,
            "/v1/admin/cluster/stop",
            "Stop the embedded cluster (`tcloud down`): at once when no task is active, else \
             as `mode` says (refuse and name them, drain, or cancel them).",
        )
        .takes(Json(one::<StopCluster>))
        .answers(200, Json(one::<ClusterStopView>)),
        op(
            M::GET,
            "/v1/admin/cluster/stop",
            "How far a stop of the embedded cluster has got.",
        )
        .answers(200, Json(one::<ClusterStopView>)),
        op(M::GET, "/v1/admin/users", "Every user.").answers(200, Json(many::<UserView>)),
        op(
            M::POST,
            "/v1/admin/users",
            "Create a user and their first token (shown once).",
        )
        .takes(Json(one::<CreateUser>))
        .answers(201, Json(one::<UserCreated>)),
        op(
            M::GET,
            "/v1/admin/tokens",
            "Every token (never its secret).",
        )
        .answers(200, Json(many::<TokenView>)),
        op(
            M::POST,
            "/v1/admin/tokens",
            "Issue another API token for a user (shown once).",
        )
        .takes(Json(one::<CreateToken>))
        .answers(201, Json(one::<TokenIssued>)),
        op(
            M::POST,
            "/v1/admin/tokens/{id}/revoke",
            "Revoke a token; it stops working at once.",
        )
        .answers(204, Body::None),
        op(
            M::POST,
            "/v1/admin/agent-tokens",
            "Issue a join token with which a new agent registers its node.",
        )
        .query(&[
            (
                "ttl_secs",
                Type::Integer,
                "How long the join token can be used (an hour when absent).",
            ),
            (
                "node",
                Type::String,
                "Bind the token to this node name: it enrols that node only.",
            ),
            (
                "nodes",
                Type::Integer,
                "How many nodes the token may enrol (1 when absent).",
            ),
        ])
        .answers(201, Json(one::<TokenIssued>)),
        op(M::GET, "/v1/admin/audit", "The audit trail, newest first.")
            .query(&[
                (
                    "limit",
                    Type::Integer,
                    "Entries listed at most (100 when absent).",
                ),
                (
                    "since",
                    Type::Integer,
                    "Only entries at or after this time (milliseconds since the epoch).",
                ),
            ])
            .answers(200, Json(many::<AuditView>)),
        op(
            M::POST,
            "/v1/admin/nodes/{name}/drain",
            "Drain a node: its running tasks finish, it gets no new work.",
        )
        .answers(200, Json(one::<NodeView>)),
        op(
            M::POST,
            "/v1/admin/nodes/{name}/resume",
            "Give a drained node work again.",
        )
        .answers(200, Json(one::<NodeView>)),
        op(
            M::POST,
            "/v1/admin/nodes/{name}/approve",
            "Approve a node that enrolled while the server requires approval: it gets work from now on.",
        )
        .answers(200, Json(one::<NodeView>)),
        op(
            M::DELETE,
            "/v1/admin/nodes/{name}",
            "Remove a node that is down.",
        )
        .answers(204, Body::None),
        op(
            M::POST,
            "/v1/agents/register",
            "An agent registers its node (with a join token, or its node credential).",
        )
        .takes(Json(one::<RegisterAgent>))
        .answers(200, Json(one::<AgentRegistered>)),
        op(
            M::POST,
            "/v1/agents/{node}/work",
            "Long poll for the complete set of attempts the node should run (also its heartbeat).",
        )
        .takes(Json(one::<WorkPoll>))
        .answers(200, Json(one::<DesiredWork>)),
        op(
            M::POST,
            "/v1/agents/{node}/reports",
            "The node's reports, in the order things happened.",
        )
        .takes(Json(one::<AgentReports>))
        .answers(200, Json(one::<ReportsAck>)),
        op(
            M::GET,
            "/v1/agents/{node}/inputs/{task}/{attempt}/{index}",
            "One input file of a pipeline stage's attempt the node runs (the `index`th of \
             its assignment's `inputs`).",
        )
        .answers(200, Raw(BYTES, bytes)),
        op(
            M::PUT,
            "/v1/agents/{node}/outputs/{task}/{attempt}/{path}",
            "Upload one output file of an attempt the node ran.",
        )
        .query(&[(
            "rank",
            Type::Integer,
            "The node rank that wrote it (0 when absent).",
        )])
        .takes(Raw(BYTES, bytes))
        .answers(204, Body::None),
        op(
            M::POST,
            "/v1/agents/{node}/answers/{request}",
            "Answer a question the work poll carried (a listing or a refusal).",
        )
        .takes(Json(one::<NodeAnswer>))
        .answers(204, Body::None),
        op(
            M::PUT,
            "/v1/agents/{node}/answers/{request}/file",
            "Answer a question for a live file with its bytes.",
        )
        .takes(Raw(BYTES, bytes))
        .answers(204, Body::None),
        op(
            M::GET,
            "/v1/agents/{node}/sessions/{session}",
            "The node's half of an interactive session it was asked to open in its work \
             poll: an HTTP/1.1 upgrade (`Upgrade: tacc-session`), spliced to the user's.",
        )
        .answers(101, Body::None),
    ]
}

/// The OpenAPI form of a route path: axum's catch-all `{*path}` is a plain `{path}`.
pub(crate) fn openapi_path(path: &str) -> String {
    path.replace("{*", "{")
}

/// The names of a path's `{parameters}`, in order.
fn path_params(path: &str) -> Vec<&str> {
    path.split('/')
        .filter_map(|segment| segment.strip_prefix('{')?.strip_suffix('}'))
        .collect()
}

/// A path parameter's type and meaning, by the path it is in and its name.
fn path_param(path: &str, name: &str) -> (Type, &'static str) {
    match name {
        "id" if path.starts_with("/v1/snapshots/") => {
            (Type::String, "Snapshot id (hex BLAKE3 of the manifest).")
        }
        "id" if path.starts_with("/v1/admin/tokens/") => (Type::Integer, "Token id."),
        "id" if path.starts_with("/v1/groups/") => (Type::String, "Task group id, `g12` or `12`."),
        "id" | "task" => (Type::Integer, "Task id."),
        "attempt" => (Type::Integer, "Attempt number (1 for the first)."),
        "node" => (Type::Integer, "The node's id (its credential's own)."),
        "request" => (Type::Integer, "Question id from the work poll."),
        "session" => (Type::Integer, "Session id from the work poll."),
        "hash" => (Type::String, "Chunk name (hex BLAKE3 of its content)."),
        "name" if path.starts_with("/v1/secrets/") => (Type::String, "Secret name."),
        "name" => (Type::String, "Node name."),
        "path" => (Type::String, "File path relative to the working directory."),
        _ => (Type::String, ""),
    }
}

/// Who may call a route, in the words of the access rules.
fn access_text(access: Access) -> &'static str {
    match access {
        Access::Public => "Anyone, without a token.",
        Access::User => "Any user; what it shows or changes is limited to the caller's own.",
        Access::Task => "The task's owner, their group's admin, or an admin; others get 404.",
        Access::TaskSession => {
            "The task's owner, their group's admin, or an admin; others get 404, a node \
             credential included."
        }
        Access::Group => {
            "The task group's owner, their group's admin, or an admin; others get 404."
        }
        Access::Snapshot => {
            "A user who may read a task using the snapshot or who committed it, or a node \
             running an attempt on it; others get 404."
        }
        Access::Chunk => "An admin, or a node running an attempt whose snapshot holds the chunk.",
        Access::Admin => "Admins only.",
        Access::Register => "A join token, or a node's own credential (re-registration).",
        Access::OwnNode => "The node whose credential it is, for its own `{node}` only.",
        Access::Metrics => "A scrape token (`taccd admin metrics-token`) or an admin.",
    }
}

fn http_method(method: &Method) -> HttpMethod {
    match *method {
        Method::POST => HttpMethod::Post,
        Method::PUT => HttpMethod::Put,
        Method::DELETE => HttpMethod::Delete,
        Method::PATCH => HttpMethod::Patch,
        Method::HEAD => HttpMethod::Head,
        _ => HttpMethod::Get,
    }
}

/// `GET /v1/tasks/{id}/logs` → `get_v1_tasks_id_logs`.
fn operation_id(method: &Method, path: &str) -> String {
    let mut id = method.as_str().to_lowercase();
    for part in path.split(|c: char| !c.is_ascii_alphanumeric()) {
        if !part.is_empty() {
            id.push('_');
            id.push_str(part);
        }
    }
    id
}

fn content(
    body: Body,
    schemas: &mut BTreeMap<String, RefOr<Schema>>,
) -> Option<(String, utoipa::openapi::Content)> {
    let (content_type, describe) = match body {
        Body::None => return None,
        Body::Json(describe) => ("application/json", describe),
        Body::Raw(content_type, describe) => (content_type, describe),
    };
    let (schema, needed) = describe();
    schemas.extend(needed);
    Some((
        content_type.to_string(),
        ContentBuilder::new().schema(Some(schema)).build(),
    ))
}

/// The description of API v1, for the routes `rules` declares (every route a
/// description exists for; see the tests for the other direction).
fn document(rules: &[RouteRule]) -> OpenApi {
    let access: BTreeMap<(Method, String), Access> = rules
        .iter()
        .map(|r| ((r.method.clone(), openapi_path(r.path)), r.access))
        .collect();
    let mut schemas: BTreeMap<String, RefOr<Schema>> = BTreeMap::new();
    let mut paths = Paths::new();
    let (error, needed) = one::<ApiError>();
    schemas.extend(needed);
    for operation in described() {
        let Some(rule) = access
            .get(&(operation.method.clone(), operation.path.to_string()))
            .copied()
        else {
            continue;
        };
        let mut built = OperationBuilder::new()
            .operation_id(Some(operation_id(&operation.method, operation.path)))
            .summary(Some(operation.summary))
            .description(Some(format!("Access: {}", access_text(rule))))
            .tag(
                operation
                    .path
                    .trim_start_matches("/v1/")
                    .trim_start_matches('/')
                    .split('/')
                    .next()
                    .unwrap_or("api"),
            );
        for name in path_params(operation.path) {
            let (kind, meaning) = path_param(operation.path, name);
            built = built.parameter(
                ParameterBuilder::new()
                    .name(name)
                    .parameter_in(ParameterIn::Path)
                    .required(Required::True)
                    .description(Some(meaning))
                    .schema(Some(ObjectBuilder::new().schema_type(kind).build())),
            );
        }
        for (name, kind, meaning) in operation.query {
            built = built.parameter(
                ParameterBuilder::new()
                    .name(*name)
                    .parameter_in(ParameterIn::Query)
                    .required(Required::False)
                    .description(Some(*meaning))
                    .schema(Some(ObjectBuilder::new().schema_type(kind.clone()).build())),
            );
        }
        if operation.keyed {
            built = built.parameter(
                ParameterBuilder::new()
                    .name("Idempotency-Key")
                    .parameter_in(ParameterIn::Header)
                    .required(Required::False)
                    .description(Some(
                        "Makes the request exactly-once: 1 to 255 printable ASCII characters \
                         (a fresh UUID per logical request), kept per user for 24 hours. The \
                         same key with the same request answers the first reply again (marked by \
                         the response header `Idempotent-Replay: true`) and does no new work; \
                         with another request, 409.",
                    ))
                    .schema(Some(ObjectBuilder::new().schema_type(Type::String).build())),
            );
        }
        if let Some((content_type, body)) = content(operation.request, &mut schemas) {
            built = built.request_body(Some(
                RequestBodyBuilder::new()
                    .required(Some(Required::True))
                    .content(content_type, body)
                    .build(),
            ));
        }
        let mut success = ResponseBuilder::new().description(match operation.status {
            201 => "Created.",
            204 => "Done; no content.",
            _ => "Success.",
        });
        if let Some((content_type, body)) = content(operation.response, &mut schemas) {
            success = success.content(content_type, body);
        }
        built = built.response(operation.status.to_string(), success);
        if operation.keyed {
            built = built.response(
                "409",
                ResponseBuilder::new()
                    .description(
                        "The `Idempotency-Key` was used for another request: use a new key.",
                    )
                    .content(
                        "application/json",
                        ContentBuilder::new().schema(Some(error.clone())).build(),
                    ),
            );
        }
        built = built.response(
            "default",
            ResponseBuilder::new()
                .description(
                    "An error: `code` is stable and machine-readable, `message` says what \
                     was wrong and how to fix it.",
                )
                .content(
                    "application/json",
                    ContentBuilder::new().schema(Some(error.clone())).build(),
                ),
        );
        built = if rule == Access::Public {
            built.securities(Some(Vec::<SecurityRequirement>::new()))
        } else {
            built.security(SecurityRequirement::new("bearer", Vec::<String>::new()))
        };
        paths.add_path_operation(
            openapi_path(operation.path),
            vec![http_method(&operation.method)],
            built.build(),
        );
    }
    let mut components = ComponentsBuilder::new().security_scheme(
        "bearer",
        SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
    );
    for (name, schema) in schemas {
        components = components.schema(name, schema);
    }
    OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("TACC API")
                .version(env!("CARGO_PKG_VERSION"))
                .description(Some(
                    "API v1 of the TACC control plane (`taccd server`): tasks, logs, \
                     snapshots, nodes, accounts, and the agent protocol. Every request \
                     but the public ones carries `Authorization: Bearer <token>`.",
                ))
                .build(),
        )
        .paths(paths)
        .components(Some(components.build()))
        .build()
}

/// The routes of the HTTP API: every declared route but the browser dashboard's pages
/// (`/` and `/ui/…`), which answer HTML to people, not JSON to programs.
fn api_routes() -> Vec<RouteRule> {
    route_rules()
        .into_iter()
        .filter(|r| !(r.path == "/" || r.path == "/ui" || r.path.starts_with("/ui/")))
        .collect()
}

/// The description of every declared route, as JSON.
pub fn openapi_json() -> serde_json::Value {
    serde_json::to_value(document(&api_routes())).expect("the description serialises")
}

pub(super) async fn serve() -> axum::Json<serde_json::Value> {
    axum::Json(openapi_json())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    const COMMITTED_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");

    /// (METHOD, path) of every operation the document describes.
    fn operations(document: &serde_json::Value) -> BTreeSet<(String, String)> {
        let mut found = BTreeSet::new();
        for (path, item) in document["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("a path item").keys() {
                if ["get", "put", "post", "delete", "patch", "head", "options"]
                    .contains(&method.as_str())
                {
                    found.insert((method.to_uppercase(), path.clone()));
                }
            }
        }
        found
    }

    #[test]
    fn every_route_is_described_with_its_method_and_nothing_else_is() {
        let declared: BTreeSet<(String, String)> = api_routes()
            .iter()
            .map(|r| (r.method.to_string(), openapi_path(r.path)))
            .collect();
        let described_routes: BTreeSet<(String, String)> = described()
            .iter()
            .map(|o| (o.method.to_string(), o.path.to_string()))
            .collect();
        let missing: Vec<_> = declared.difference(&described_routes).collect();
        assert!(
            missing.is_empty(),
            "routes without a description (add them to `described` in api/openapi.rs): {missing:?}"
        );
        let stale: Vec<_> = described_routes.difference(&declared).collect();
        assert!(
            stale.is_empty(),
            "descriptions of routes that do not exist (remove them from api/openapi.rs): {stale:?}"
        );
        // And the served document itself says exactly that.
        assert_eq!(operations(&openapi_json()), declared);
    }

    #[test]
    fn the_document_is_valid_openapi_and_every_reference_resolves() {
        let document = openapi_json();
        let text = serde_json::to_string(&document).unwrap();
        let parsed = oas3::from_json(&text).expect("a valid OpenAPI 3.1 document");
        assert!(parsed.openapi.starts_with("3.1"), "{}", parsed.openapi);
        let schemas = document["components"]["schemas"]
            .as_object()
            .expect("component schemas");
        // Every $ref anywhere names a component schema that exists.
        fn refs<'v>(value: &'v serde_json::Value, found: &mut Vec<&'v str>) {
            match value {
                serde_json::Value::Object(map) => {
                    if let Some(target) = map.get("$ref").and_then(|r| r.as_str()) {
                        found.push(target);
                    }
                    map.values().for_each(|v| refs(v, found));
                }
                serde_json::Value::Array(items) => items.iter().for_each(|v| refs(v, found)),
                _ => {}
            }
        }
        let mut found = Vec::new();
        refs(&document, &mut found);
        assert!(found.len() > 50, "{} references", found.len());
        for target in found {
            let name = target
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("{target} is not a component schema reference"));
            assert!(schemas.contains_key(name), "{target} does not exist");
        }
        // Every operation: an id, a success response, an error response, its path
        // parameters declared, and the bearer scheme unless it is public.
        let mut ids = BTreeSet::new();
        for (path, item) in document["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                let id = operation["operationId"].as_str().expect("an operation id");
                assert!(ids.insert(id.to_string()), "{id} twice");
                let responses = operation["responses"].as_object().unwrap();
                // A session route succeeds by switching protocols.
                assert!(
                    responses
                        .keys()
                        .any(|code| code.starts_with('2') || code == "101"),
                    "{method} {path}"
                );
                assert!(responses.contains_key("default"), "{method} {path}");
                let declared: BTreeSet<&str> = operation["parameters"]
                    .as_array()
                    .map(|ps| {
                        ps.iter()
                            .filter(|p| p["in"] == "path")
                            .map(|p| p["name"].as_str().unwrap())
                            .collect()
                    })
                    .unwrap_or_default();
                let wanted: BTreeSet<&str> = path_params(path).into_iter().collect();
                assert_eq!(declared, wanted, "{method} {path}");
                let secured = !operation["security"].as_array().unwrap().is_empty();
                let public = api_routes().iter().any(|r| {
                    openapi_path(r.path) == *path
                        && r.method.as_str().eq_ignore_ascii_case(method)
                        && r.access == Access::Public
                });
                assert_eq!(secured, !public, "{method} {path}");
            }
        }
        // The wire types are described field by field, from their own definitions.
        let task_view = &schemas["TaskView"]["properties"];
        for field in ["id", "state", "reason", "per_node", "submitted_at"] {
            assert!(task_view.get(field).is_some(), "TaskView.{field}");
        }
        let states: Vec<&str> = tacc_core::TaskState::ALL
            .iter()
            .map(|s| s.as_str())
            .collect();
        assert_eq!(schemas["TaskState"]["enum"], serde_json::json!(states));
    }

    #[test]
    fn committed_description_is_up_to_date() {
        let mut generated = serde_json::to_string_pretty(&openapi_json()).unwrap();
        generated.push('\n');
        if std::env::var_os("TACC_UPDATE_SCHEMA").is_some() {
            std::fs::write(COMMITTED_PATH, &generated).unwrap();
            return;
        }
        let committed = std::fs::read_to_string(COMMITTED_PATH).unwrap_or_default();
        assert!(
            committed == generated,
            "docs/openapi.json is out of date with the API; regenerate it with \
             `TACC_UPDATE_SCHEMA=1 cargo test -p tacc-server --lib openapi` and commit it"
        );
    }
}
