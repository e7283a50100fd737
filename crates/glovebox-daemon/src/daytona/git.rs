//! Daytona's toolbox git API, where the template has git: each call is `git -C <path> …` run
//! inside the sandbox as an argv command (no shell between the user's strings and git).
//! Operations that need credentials or the network on the user's behalf (push, pull, clone
//! with a username and password) are refused as unsupported.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};

use super::process::request;
use super::{Daytona, DtError, Tb};
use crate::ops;

pub fn routes() -> Router<Daytona> {
    Router::new()
        .route("/git/init", post(init))
        .route("/git/clone", post(clone))
        .route("/git/add", post(add))
        .route("/git/commit", post(commit))
        .route("/git/status", get(status))
        .route("/git/branches", get(branches).post(create_branch).delete(delete_branch))
        .route("/git/checkout", post(checkout))
}

fn body<T: for<'de> Deserialize<'de>>(b: &Bytes) -> Result<T, DtError> {
    serde_json::from_slice(b).map_err(|e| DtError::bad(format!("invalid body: {e}")))
}

/// Runs `git -C path args…` in the sandbox; its stdout, or Daytona's error for what git
/// said (a missing git is "not supported" here: the template has none).
async fn git(st: &Daytona, tb: &Tb, path: &str, args: &[&str]) -> Result<String, DtError> {
    if path.is_empty() {
        return Err(DtError::bad("path is required"));
    }
    let mut cmd = vec!["git".to_string(), "-C".into(), path.to_string()];
    cmd.extend(args.iter().map(|a| a.to_string()));
    let no_git = || DtError::unsupported("git in a template without git");
    let r = match ops::exec(&st.app.manager, &tb.sb, request(cmd, None, BTreeMap::new(), Some(120))?).await {
        Err(crate::error::Error::File { code: glovebox_proto::agent::ErrorCode::SpawnFailed, .. }) => {
            return Err(no_git())
        }
        r => r?,
    };
    if r.exit_code == 127 {
        return Err(no_git());
    }
    if r.timed_out {
        return Err(DtError::daemon(StatusCode::REQUEST_TIMEOUT, "PROCESS_EXECUTION_TIMEOUT", "git timed out"));
    }
    if r.exit_code != 0 {
        let msg = r.stderr.trim().to_string();
        if msg.contains("not a git repository") {
            return Err(DtError::daemon(StatusCode::NOT_FOUND, "GIT_REPO_NOT_FOUND", msg));
        }
        return Err(DtError::bad(format!("git {}: {msg}", args.first().unwrap_or(&""))));
    }
    Ok(r.stdout)
}

#[derive(Deserialize)]
struct Init {
    path: String,
    bare: Option<bool>,
    initial_branch: Option<String>,
}

async fn init(State(st): State<Daytona>, tb: Tb, b: Bytes) -> Result<Response, DtError> {
    let req: Init = body(&b)?;
    ops::make_dir(&st.app.manager, &tb.sb, req.path.clone(), None).await?;
    let mut args = vec!["init", "--quiet"];
    if req.bare == Some(true) {
        args.push("--bare");
    }
    let branch;
    if let Some(b) = req.initial_branch.as_deref().filter(|b| !b.is_empty()) {
        branch = format!("--initial-branch={b}");
        args.push(&branch);
    }
    git(&st, &tb, &req.path, &args).await?;
    Ok(StatusCode::OK.into_response())
}

#[derive(Deserialize)]
struct Clone {
    url: String,
    path: String,
    branch: Option<String>,
    commit_id: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

/// `clone` from a URL the sandbox's network policy lets it reach (or a path inside it).
async fn clone(State(st): State<Daytona>, tb: Tb, b: Bytes) -> Result<Response, DtError> {
    let req: Clone = body(&b)?;
    if req.username.is_some() || req.password.is_some() {
        return Err(DtError::unsupported("git clone with credentials (use a credential-brokered domain rule)"));
    }
    if req.url.starts_with('-') || req.path.starts_with('-') {
        return Err(DtError::bad("url and path must not start with '-'"));
    }
    let mut args = vec!["clone", "--quiet"];
    if let Some(b) = req.branch.as_deref().filter(|b| !b.is_empty()) {
        args.extend(["--branch", b]);
    }
    args.extend(["--", &req.url, &req.path]);
    git(&st, &tb, "/", &args).await?;
    if let Some(c) = req.commit_id.as_deref().filter(|c| !c.is_empty()) {
        git(&st, &tb, &req.path, &["checkout", "--quiet", "--detach", c]).await?;
    }
    Ok(StatusCode::OK.into_response())
}

#[derive(Deserialize)]
struct Add {
    path: String,
    files: Vec<String>,
}

async fn add(State(st): State<Daytona>, tb: Tb, b: Bytes) -> Result<Response, DtError> {
    let req: Add = body(&b)?;
    let mut args = vec!["add", "--"];
    args.extend(req.files.iter().map(String::as_str));
    git(&st, &tb, &req.path, &args).await?;
    Ok(StatusCode::OK.into_response())
}

#[derive(Deserialize)]
struct Commit {
    path: String,
    message: String,
    author: String,
    email: String,
    allow_empty: Option<bool>,
}

async fn commit(State(st): State<Daytona>, tb: Tb, b: Bytes) -> Result<Response, DtError> {
    let req: Commit = body(&b)?;
    let (name, email) = (format!("user.name={}", req.author), format!("user.email={}", req.email));
    let mut args = vec!["-c", &name, "-c", &email, "commit", "--quiet", "-m", &req.message];
    if req.allow_empty == Some(true) {
        args.push("--allow-empty");
    }
    git(&st, &tb, &req.path, &args).await?;
    let hash = git(&st, &tb, &req.path, &["rev-parse", "HEAD"]).await?;
    Ok(axum::Json(json!({ "hash": hash.trim() })).into_response())
}

/// Daytona's name for a `git status --porcelain` status letter.
fn status_name(c: char) -> &'static str {
    match c {
        '?' => "Untracked",
        'M' | 'T' => "Modified",
        'A' => "Added",
        'D' => "Deleted",
        'R' => "Renamed",
        'C' => "Copied",
        'U' => "Updated but unmerged",
        _ => "Unmodified",
    }
}

/// `git status --porcelain --branch` as Daytona's `GitStatus`.
fn parse_status(out: &str) -> Value {
    let mut current = String::new();
    let (mut ahead, mut behind, mut upstream, mut detached) = (0, 0, Value::Null, false);
    let mut files = Vec::new();
    for line in out.lines() {
        if let Some(head) = line.strip_prefix("## ") {
            let head = head.strip_prefix("No commits yet on ").unwrap_or(head);
            let (names, counts) = head.split_once(" [").unwrap_or((head, ""));
            let (branch, up) = names.split_once("...").unwrap_or((names, ""));
            detached = branch.starts_with("HEAD (");
            current = if detached { "HEAD".into() } else { branch.to_string() };
            if !up.is_empty() {
                upstream = json!(up);
            }
            for part in counts.trim_end_matches(']').split(", ") {
                if let Some(n) = part.strip_prefix("ahead ") {
                    ahead = n.parse().unwrap_or(0);
                } else if let Some(n) = part.strip_prefix("behind ") {
                    behind = n.parse().unwrap_or(0);
                }
            }
            continue;
        }
        let mut chars = line.chars();
        let (Some(x), Some(y)) = (chars.next(), chars.next()) else { continue };
        let name = line.get(3..).unwrap_or_default();
        let (name, extra) = name.split_once(" -> ").map_or((name, ""), |(from, to)| (to, from));
        files.push(json!({ "name": name, "staging": status_name(x), "worktree": status_name(y), "extra": extra }));
    }
    json!({
        "currentBranch": current,
        "fileStatus": files,
        "ahead": ahead,
        "behind": behind,
        "branchPublished": !upstream.is_null(),
        "upstream": upstream,
        "detached": detached,
    })
}

type Q = Query<BTreeMap<String, String>>;

async fn status(State(st): State<Daytona>, tb: Tb, Query(q): Q) -> Result<Response, DtError> {
    let path = q.get("path").cloned().unwrap_or_default();
    let out = git(&st, &tb, &path, &["status", "--porcelain=v1", "--branch"]).await?;
    Ok(axum::Json(parse_status(&out)).into_response())
}

async fn branches(State(st): State<Daytona>, tb: Tb, Query(q): Q) -> Result<Response, DtError> {
    let path = q.get("path").cloned().unwrap_or_default();
    let out = git(&st, &tb, &path, &["branch", "--format=%(refname:short)"]).await?;
    let current = git(&st, &tb, &path, &["branch", "--show-current"]).await?;
    let list: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
    Ok(axum::Json(json!({ "branches": list, "current": current.trim() })).into_response())
}

#[derive(Deserialize)]
struct Branch {
    path: String,
    name: String,
}

fn branch_name(n: &str) -> Result<&str, DtError> {
    if n.is_empty() || n.starts_with('-') {
        return Err(DtError::bad("a branch name must not be empty or start with '-'"));
    }
    Ok(n)
}

async fn create_branch(State(st): State<Daytona>, tb: Tb, b: Bytes) -> Result<Response, DtError> {
    let req: Branch = body(&b)?;
    git(&st, &tb, &req.path, &["branch", branch_name(&req.name)?]).await?;
    Ok(StatusCode::CREATED.into_response())
}

async fn delete_branch(State(st): State<Daytona>, tb: Tb, b: Bytes) -> Result<Response, DtError> {
    let req: Branch = body(&b)?;
    git(&st, &tb, &req.path, &["branch", "-D", branch_name(&req.name)?]).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
struct Checkout {
    path: String,
    branch: String,
}

async fn checkout(State(st): State<Daytona>, tb: Tb, b: Bytes) -> Result<Response, DtError> {
    let req: Checkout = body(&b)?;
    git(&st, &tb, &req.path, &["checkout", "--quiet", branch_name(&req.branch)?]).await?;
    Ok(StatusCode::OK.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn porcelain_status_reads_as_daytonas() {
        let v = parse_status("## main...origin/main [ahead 2, behind 1]\nM  a.txt\n?? new.txt\nR  old -> renamed\n");
        assert_eq!(v["currentBranch"], "main");
        assert_eq!((v["ahead"].as_i64(), v["behind"].as_i64()), (Some(2), Some(1)));
        assert_eq!(v["upstream"], "origin/main");
        let files = v["fileStatus"].as_array().unwrap();
        assert_eq!(files[0]["staging"], "Modified");
        assert_eq!(files[1]["worktree"], "Untracked");
        assert_eq!((files[2]["name"].as_str(), files[2]["extra"].as_str()), (Some("renamed"), Some("old")));
        let fresh = parse_status("## No commits yet on trunk\n");
        assert_eq!((fresh["currentBranch"].as_str(), fresh["branchPublished"].as_bool()), (Some("trunk"), Some(false)));
        assert_eq!(parse_status("## HEAD (no branch)\n")["detached"], true);
    }
}
