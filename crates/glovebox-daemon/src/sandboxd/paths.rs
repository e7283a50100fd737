//! Paths as sandboxd and the python-runtime take them: relative to the sandbox's root (the
//! directory its commands start in), a leading `/` meaning that root too, and no way above
//! it. The check is lexical; the path is then resolved by the agent inside the sandbox, where
//! a symlink may lead anywhere in the sandbox's own filesystem — the sandbox, not a
//! directory, is the boundary here (sandboxd, a sidecar sharing one volume, confines symlinks
//! to its root as well).

/// A path that climbs above the root.
#[derive(Debug, PartialEq, Eq)]
pub struct Escapes;

/// The sandbox's root: the template's working directory, else the agent's home (where a
/// command starts when the template names no working directory).
pub fn root(sb: &crate::manager::Sb) -> String {
    sb.exec_defaults().0.unwrap_or_else(|| HOME.to_string())
}

/// The agent's home inside every sandbox (the python-runtime's `/app`, sandboxd's
/// `/workspace`).
const HOME: &str = "/home/user";

/// The absolute path for `given` under `root`: `.` and empty parts folded, `..` taken back,
/// one that would climb above the root refused.
pub fn resolve(root: &str, given: &str) -> Result<String, Escapes> {
    let mut parts: Vec<&str> = Vec::new();
    for p in given.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop().ok_or(Escapes)?;
            }
            p => parts.push(p),
        }
    }
    let rel = parts.join("/");
    let root = root.trim_end_matches('/');
    Ok(match (root.is_empty(), rel.is_empty()) {
        (true, true) => "/".to_string(),
        (_, true) => root.to_string(),
        _ => format!("{root}/{rel}"),
    })
}

/// How a listing names the directory it lists: `/` and the path under the root.
pub fn shown(given: &str) -> String {
    format!("/{}", given.trim_start_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_under_the_root() {
        assert_eq!(resolve("/work", "a/b.txt"), Ok("/work/a/b.txt".into()));
        assert_eq!(resolve("/work/", "/a//./b.txt"), Ok("/work/a/b.txt".into()));
        assert_eq!(resolve("/work", "a/../b"), Ok("/work/b".into()));
        assert_eq!(resolve("/work", ""), Ok("/work".into()));
        assert_eq!(resolve("/", "etc/hostname"), Ok("/etc/hostname".into()));
        assert_eq!(resolve("/", ""), Ok("/".into()));
        assert_eq!(resolve("/work", "../etc/passwd"), Err(Escapes));
        assert_eq!(resolve("/work", "a/../../x"), Err(Escapes));
        assert_eq!(resolve("/work", ".."), Err(Escapes));
    }

    proptest::proptest! {
        #[test]
        fn nothing_resolves_above_the_root(given in "[a./]{0,24}") {
            if let Ok(p) = resolve("/root", &given) {
                proptest::prop_assert!(p == "/root" || p.starts_with("/root/"));
                proptest::prop_assert!(!p.split('/').any(|c| c == ".."));
            }
        }
    }
}
