//! The caller's own secrets: set (the raw value as the body), list (names only), delete.
//! No route ever returns a value.

use tacc_proto::SecretView;

use super::prelude::*;
use crate::secrets::check_secret_name;

pub(super) async fn list_secrets(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Json<Vec<SecretView>>> {
    let user = user_of(&caller)?;
    let secrets = app.control.query().secrets(&user.name).await?;
    Ok(Json(
        secrets
            .into_iter()
            .map(|s| SecretView {
                name: s.name,
                updated_at: s.updated_at,
            })
            .collect(),
    ))
}

pub(super) async fn put_secret(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let user = user_of(&caller)?;
    check_secret_name(&name)?;
    if body.is_empty() {
        return Err(ServerError::BadRequest(format!(
            "secret {name} has an empty value; pipe the value in: `tcloud secret set {name} < file`"
        )));
    }
    if std::str::from_utf8(&body).is_err() {
        return Err(ServerError::BadRequest(format!(
            "secret {name} is not UTF-8 text; environment variables hold text (base64-encode binary values)"
        )));
    }
    let record = app
        .control
        .secret_box
        .seal(&user.name, &name, &body, crate::now())?;
    let store = &app.control.store;
    app.control
        .audit
        .audited(
            &caller,
            "secret.set",
            format!("secret:{name}"),
            String::new(),
            async { Ok(store.put_secret(record).await?) },
        )
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn delete_secret(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    let user = user_of(&caller)?;
    let missing = || {
        ServerError::NotFound(format!(
            "you have no secret named {name} (list them with `tcloud secret ls`)"
        ))
    };
    let store = &app.control.store;
    if app
        .control
        .query()
        .secret(&user.name, &name)
        .await?
        .is_none()
    {
        return Err(missing());
    }
    app.control
        .audit
        .audited(
            &caller,
            "secret.delete",
            format!("secret:{name}"),
            String::new(),
            async {
                if store.delete_secret(&user.name, &name).await? {
                    Ok(())
                } else {
                    Err(missing())
                }
            },
        )
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
