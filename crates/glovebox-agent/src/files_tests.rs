//! Tests of the file API, driven over a real socket pair against a fake root in a temp dir.

use super::*;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{symlink, FileTypeExt, PermissionsExt};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const T: Duration = Duration::from_secs(20);

/// A temp dir holding `root/` (the fake sandbox root, with `/home/user`) and room outside it.
struct Fixture {
    dir: tempfile::TempDir,
    files: Files,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("root/home/user")).unwrap();
        let files = Files::open(&dir.path().join("root"), "/home/user").unwrap();
        Fixture { dir, files }
    }

    /// Host path of a sandbox path (test side only).
    fn host(&self, sandbox: &str) -> std::path::PathBuf {
        self.dir.path().join("root").join(sandbox.trim_start_matches('/'))
    }

    fn outside(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }
}

struct Client(UnixStream);

impl Client {
    async fn send(&mut self, kind: Kind, payload: &[u8]) {
        self.0.write_all(&frame::encode(kind, payload).unwrap()).await.unwrap();
    }

    async fn json(&mut self, v: &Request) {
        self.send(Kind::Json, &serde_json::to_vec(v).unwrap()).await;
    }

    async fn read_all(&mut self) -> Vec<(Kind, Vec<u8>)> {
        let mut buf = Vec::new();
        self.0.read_to_end(&mut buf).await.unwrap();
        let (frames, used) = frame::decode_all(&buf).unwrap();
        assert_eq!(used, buf.len(), "trailing partial frame");
        frames
    }
}

/// What the daemon would see for one request.
#[derive(Debug)]
struct Outcome {
    replies: Vec<Reply>,
    data: Vec<u8>,
    /// What `handle` returned.
    conn_ok: bool,
}

impl Outcome {
    fn only(&self) -> &Reply {
        assert_eq!(self.replies.len(), 1, "{:?}", self.replies);
        &self.replies[0]
    }

    fn info(&self) -> FileInfo {
        match self.only() {
            Reply::FileInfo(fi) => fi.clone(),
            other => panic!("expected file info, got {other:?}"),
        }
    }

    fn error(&self) -> (ErrorCode, String) {
        match self.replies.last() {
            Some(Reply::Error { code, message }) => (*code, message.clone()),
            other => panic!("expected an error, got {other:?} in {:?}", self.replies),
        }
    }
}

/// Runs one request; `upload` is sent as data frames followed by `end_data`.
async fn call(files: &Files, req: Request, upload: Option<&[u8]>) -> Outcome {
    let (a, b) = UnixStream::pair().unwrap();
    let mut client = Client(b);
    let server = async {
        let (mut r, mut w) = conn::split(a);
        files.handle(req, &mut r, &mut w).await.is_ok()
        // Dropping both halves here ends the stream for the client.
    };
    let talk = async {
        if let Some(bytes) = upload {
            for c in bytes.chunks(frame::CHUNK) {
                client.send(Kind::Data, c).await;
            }
            client.json(&Request::EndData).await;
        }
        client.read_all().await
    };
    let (conn_ok, frames) = tokio::time::timeout(T, async { tokio::join!(server, talk) }).await.expect("request hung");
    let mut replies = Vec::new();
    let mut data = Vec::new();
    for (kind, body) in frames {
        match kind {
            Kind::Json => replies.push(serde_json::from_slice(&body).unwrap()),
            Kind::Data => {
                assert!(replies.len() == 1, "data outside a read: {replies:?}");
                data.extend(body);
            }
            other => panic!("unexpected {other:?} frame"),
        }
    }
    Outcome { replies, data, conn_ok }
}

async fn write(files: &Files, path: &str, bytes: &[u8]) -> Outcome {
    call(
        files,
        Request::WriteFile { path: path.into(), mode: None, parents: true, owner: None, xattrs: Default::default() },
        Some(bytes),
    )
    .await
}

async fn read(files: &Files, path: &str) -> Outcome {
    call(files, Request::ReadFile { path: path.into() }, None).await
}

/// Reads a file that must exist: returns its bytes, checking the reply sequence.
async fn read_ok(files: &Files, path: &str) -> Vec<u8> {
    let o = read(files, path).await;
    assert!(matches!(o.replies.as_slice(), [Reply::FileInfo(_), Reply::Ok]), "{:?}", o.replies);
    o.data
}

fn req_list(path: &str, depth: u32) -> Request {
    Request::ListDir { path: path.into(), depth }
}

fn entries(o: &Outcome) -> Vec<String> {
    match o.only() {
        Reply::Entries { entries } => entries.iter().map(|e| e.path.clone()).collect(),
        other => panic!("expected entries, got {other:?}"),
    }
}

#[tokio::test]
async fn write_then_read_round_trip() {
    let fx = Fixture::new();
    let blob: Vec<u8> = (0..5 * 1024 * 1024 + 17).map(|i: u32| (i.wrapping_mul(31) % 251) as u8).collect();
    assert!(blob.contains(&0));
    let fi = write(&fx.files, "/data/deep/blob.bin", &blob).await.info();
    assert_eq!(fi.path, "/data/deep/blob.bin");
    assert_eq!(fi.name, "blob.bin");
    assert_eq!(fi.kind, FileType::File);
    assert_eq!(fi.size, blob.len() as u64);
    assert_eq!(fi.mode, 0o644);
    let o = read(&fx.files, "/data/deep/blob.bin").await;
    assert_eq!(o.replies.first().map(|r| matches!(r, Reply::FileInfo(fi) if fi.size == blob.len() as u64)), Some(true));
    assert_eq!(o.replies.last(), Some(&Reply::Ok));
    assert!(o.data == blob, "read back {} bytes that differ", o.data.len());
    assert_eq!(std::fs::metadata(fx.host("/data/deep")).unwrap().permissions().mode() & 0o777, 0o755);
    // Overwrite keeps the existing mode unless one is given.
    std::fs::set_permissions(fx.host("/data/deep/blob.bin"), std::fs::Permissions::from_mode(0o750)).unwrap();
    assert_eq!(write(&fx.files, "/data/deep/blob.bin", b"short").await.info().mode, 0o750);
    assert_eq!(read_ok(&fx.files, "/data/deep/blob.bin").await, b"short");
    let o = call(
        &fx.files,
        Request::WriteFile {
            path: "/x.sh".into(),
            mode: Some(0o700),
            parents: false,
            owner: None,
            xattrs: Default::default(),
        },
        Some(b"#!"),
    )
    .await;
    assert_eq!(o.info().mode, 0o700);
    // An empty upload is an empty file.
    assert_eq!(write(&fx.files, "/empty", b"").await.info().size, 0);
    assert_eq!(read_ok(&fx.files, "/empty").await, b"");
}

#[tokio::test]
async fn relative_paths_are_under_home() {
    let fx = Fixture::new();
    let fi = write(&fx.files, "notes.txt", b"hi").await.info();
    assert_eq!(fi.path, "/home/user/notes.txt");
    assert_eq!(std::fs::read(fx.host("/home/user/notes.txt")).unwrap(), b"hi");
    assert_eq!(read_ok(&fx.files, "./notes.txt").await, b"hi");
    assert_eq!(read_ok(&fx.files, "../user/notes.txt").await, b"hi");
}

#[tokio::test]
async fn bad_paths_and_modes_are_invalid() {
    let fx = Fixture::new();
    let (code, msg) = read(&fx.files, "").await.error();
    assert_eq!((code, msg.as_str()), (ErrorCode::InvalidArgument, "read: empty path"));
    assert_eq!(read(&fx.files, "a\0b").await.error().0, ErrorCode::InvalidArgument);
    let o = call(
        &fx.files,
        Request::WriteFile {
            path: "/m".into(),
            mode: Some(0o4755),
            parents: true,
            owner: None,
            xattrs: Default::default(),
        },
        Some(b"x"),
    )
    .await;
    assert_eq!(o.error().0, ErrorCode::InvalidArgument);
    assert!(!fx.host("/m").exists());
    assert_eq!(read(&fx.files, "/home").await.error().0, ErrorCode::IsADirectory);
    assert_eq!(write(&fx.files, "/home", b"x").await.error().0, ErrorCode::IsADirectory);
    assert_eq!(write(&fx.files, "/", b"x").await.error().0, ErrorCode::IsADirectory);
    let o = call(
        &fx.files,
        Request::WriteFile {
            path: "/no/such/f".into(),
            mode: None,
            parents: false,
            owner: None,
            xattrs: Default::default(),
        },
        Some(b"x"),
    )
    .await;
    assert_eq!(o.error().0, ErrorCode::NotFound);
    assert!(o.conn_ok, "a file error is not a connection error");
}

#[tokio::test]
async fn errors_name_the_given_path_in_lower_case() {
    let fx = Fixture::new();
    let (code, msg) = read(&fx.files, "../../etc/shadow").await.error();
    assert_eq!(code, ErrorCode::NotFound);
    assert_eq!(msg, "read ../../etc/shadow: no such file or directory");
    let (_, msg) = read(&fx.files, "/bad\nname").await.error();
    assert_eq!(msg, "read /bad\\nname: no such file or directory");
    assert!(!msg.contains(fx.dir.path().to_str().unwrap()));
}

#[tokio::test]
async fn dot_dot_and_symlinks_stay_inside_the_root() {
    let fx = Fixture::new();
    let secret = fx.outside("secret.txt");
    std::fs::write(&secret, b"host secret").unwrap();
    std::fs::create_dir_all(fx.host("/etc")).unwrap();
    std::fs::write(fx.host("/etc/passwd"), b"fake passwd").unwrap();
    symlink("/", fx.host("/evil")).unwrap();
    symlink("../../../..", fx.host("/evil2")).unwrap();
    symlink("../secret.txt", fx.host("/evil3")).unwrap();
    symlink(&secret, fx.host("/evil4")).unwrap();

    assert_eq!(read_ok(&fx.files, "../../etc/passwd").await, b"fake passwd");
    assert_eq!(read_ok(&fx.files, "/../../etc/passwd").await, b"fake passwd");
    assert_eq!(read_ok(&fx.files, "/evil/etc/passwd").await, b"fake passwd");
    assert_eq!(read_ok(&fx.files, "/evil2/etc/passwd").await, b"fake passwd");
    for p in [
        "../../secret.txt",
        "/../../x/../secret.txt",
        "/evil/secret.txt",
        "/evil2/secret.txt",
        "/evil2/../secret.txt",
        "/evil3",
        "/evil4",
    ] {
        let o = read(&fx.files, p).await;
        assert_eq!(o.error().0, ErrorCode::NotFound, "{p}: {o:?}");
        assert!(o.data.is_empty());
    }
    // Writes through the same routes land inside the root and leave the host file alone.
    write(&fx.files, "/evil2/secret.txt", b"pwned").await.info();
    write(&fx.files, "/../../secret.txt", b"pwned").await.info();
    write(&fx.files, "/evil/sub/secret.txt", b"pwned").await.info();
    assert_eq!(std::fs::read(&secret).unwrap(), b"host secret");
    assert_eq!(std::fs::read(fx.host("/secret.txt")).unwrap(), b"pwned");
    assert_eq!(read_ok(&fx.files, "/evil3").await, b"pwned");
    // Writing to a symlink replaces the link, even one that points outside.
    write(&fx.files, "/evil4", b"pwned").await.info();
    assert_eq!(std::fs::read(&secret).unwrap(), b"host secret");
    assert!(!std::fs::symlink_metadata(fx.host("/evil4")).unwrap().file_type().is_symlink());
    // Listing through a link to "../../../.." lists the root, not the temp dir.
    let names = entries(&call(&fx.files, req_list("/evil2", 1), None).await);
    assert!(names.contains(&"/evil2/etc".to_string()), "{names:?}");
    assert!(!names.iter().any(|n| n.ends_with("/root")), "{names:?}");
    // Mkdir, rename and remove through the links stay inside too.
    call(&fx.files, Request::MakeDir { path: "/evil2/made".into(), parents: false, owner: None }, None).await.info();
    assert!(fx.host("/made").is_dir() && !fx.outside("made").exists());
    let o = call(&fx.files, Request::Rename { from: "/evil/secret.txt".into(), to: "/evil2/moved".into() }, None).await;
    assert_eq!(o.info().path, "/evil2/moved");
    assert!(secret.exists() && fx.host("/moved").exists());
    call(&fx.files, Request::Remove { path: "/evil2/moved".into(), recursive: false }, None).await;
    assert!(secret.exists() && !fx.host("/moved").exists());
}

#[tokio::test]
async fn proc_links_inside_the_root_do_not_reach_the_host() {
    let fx = Fixture::new();
    symlink("/proc/self/root", fx.host("/procroot")).unwrap();
    symlink("/proc/self/cwd", fx.host("/proccwd")).unwrap();
    // IN_ROOT resolves the absolute target inside the fake root, where there is no /proc.
    assert_eq!(read(&fx.files, "/procroot/etc/hostname").await.error().0, ErrorCode::NotFound);
    assert_eq!(call(&fx.files, req_list("/proccwd", 1), None).await.error().0, ErrorCode::NotFound);
}

#[tokio::test]
async fn magic_links_are_refused() {
    // Against the real "/": only reads of a temp file this test created.
    let files = Files::open(Path::new("/"), "/").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("magic.txt");
    std::fs::write(&target, b"magic").unwrap();
    let held = File::open(&target).unwrap();
    let direct = target.to_str().unwrap();
    // Control: the plain path works, so a refusal below is about the magic link.
    assert_eq!(read_ok(&files, direct).await, b"magic");
    for p in [
        format!("/proc/self/fd/{}", held.as_raw_fd()),
        format!("/proc/self/root{direct}"),
        format!("/proc/{}/root{direct}", std::process::id()),
    ] {
        let o = read(&files, &p).await;
        assert_eq!(o.error().0, ErrorCode::InvalidArgument, "{p}: {o:?}");
        assert!(o.data.is_empty());
        let o = call(&files, Request::Stat { path: format!("{p}/x") }, None).await;
        assert!(matches!(o.only(), Reply::Error { .. }), "{p}: {o:?}");
    }
    // Lstat of the link itself is fine: it is not followed.
    let fi = call(&files, Request::Stat { path: format!("/proc/self/fd/{}", held.as_raw_fd()) }, None).await.info();
    assert_eq!(fi.kind, FileType::Symlink);
}

#[tokio::test]
async fn fifos_and_devices_are_not_read_or_written() {
    let fx = Fixture::new();
    let root = rfs::open(fx.host("/"), OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
    rfs::mkfifoat(&root, "fifo", Mode::from_raw_mode(0o644)).unwrap();
    let o = read(&fx.files, "/fifo").await;
    assert_eq!(o.error(), (ErrorCode::InvalidArgument, "read /fifo: not a regular file".into()));
    assert_eq!(o.replies.len(), 1);
    let o = write(&fx.files, "/fifo", b"x").await;
    assert_eq!(o.error().0, ErrorCode::InvalidArgument);
    assert!(std::fs::symlink_metadata(fx.host("/fifo")).unwrap().file_type().is_fifo());
}

fn dir_names(p: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(p).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[tokio::test]
async fn interrupted_upload_leaves_nothing() {
    let fx = Fixture::new();
    std::fs::create_dir_all(fx.host("/up")).unwrap();
    let (a, b) = UnixStream::pair().unwrap();
    let mut client = Client(b);
    let req = Request::WriteFile {
        path: "/up/big.bin".into(),
        mode: None,
        parents: false,
        owner: None,
        xattrs: Default::default(),
    };
    let server = async {
        let (mut r, mut w) = conn::split(a);
        fx.files.handle(req, &mut r, &mut w).await
    };
    let talk = async {
        for _ in 0..20 {
            client.send(Kind::Data, &[7u8; frame::CHUNK]).await;
        }
        // Half a frame, then hang up.
        client.0.write_all(&frame::header(Kind::Data, 100).unwrap()).await.unwrap();
        client.0.write_all(&[1; 10]).await.unwrap();
        drop(client);
    };
    let (res, ()) = tokio::time::timeout(T, async { tokio::join!(server, talk) }).await.unwrap();
    assert!(res.is_err(), "a cut connection is a connection error");
    assert!(dir_names(&fx.host("/up")).is_empty(), "{:?}", dir_names(&fx.host("/up")));

    // The same at a frame boundary, and an existing file is left as it was.
    std::fs::write(fx.host("/up/big.bin"), b"old").unwrap();
    let (a, b) = UnixStream::pair().unwrap();
    let mut client = Client(b);
    let req = Request::WriteFile {
        path: "/up/big.bin".into(),
        mode: None,
        parents: false,
        owner: None,
        xattrs: Default::default(),
    };
    let server = async {
        let (mut r, mut w) = conn::split(a);
        fx.files.handle(req, &mut r, &mut w).await
    };
    let talk = async {
        client.send(Kind::Data, b"new data").await;
        drop(client);
    };
    let (res, ()) = tokio::time::timeout(T, async { tokio::join!(server, talk) }).await.unwrap();
    assert!(res.is_err());
    assert_eq!(dir_names(&fx.host("/up")), vec!["big.bin"]);
    assert_eq!(std::fs::read(fx.host("/up/big.bin")).unwrap(), b"old");
}

#[tokio::test]
async fn upload_protocol_violation_leaves_nothing() {
    let fx = Fixture::new();
    let (a, b) = UnixStream::pair().unwrap();
    let mut client = Client(b);
    let req = Request::WriteFile {
        path: "/v.bin".into(),
        mode: None,
        parents: false,
        owner: None,
        xattrs: Default::default(),
    };
    let server = async {
        let (mut r, mut w) = conn::split(a);
        fx.files.handle(req, &mut r, &mut w).await.is_ok()
    };
    let talk = async {
        client.send(Kind::Data, b"abc").await;
        client.send(Kind::Stdin, b"abc").await;
        client.read_all().await
    };
    let (ok, frames) = tokio::time::timeout(T, async { tokio::join!(server, talk) }).await.unwrap();
    assert!(ok);
    let reply: Reply = serde_json::from_slice(&frames[0].1).unwrap();
    assert!(matches!(reply, Reply::Error { code: ErrorCode::Protocol, .. }), "{reply:?}");
    assert_eq!(dir_names(&fx.host("/")), vec!["home"]);
}

#[tokio::test]
async fn list_depth_one_and_two() {
    let fx = Fixture::new();
    std::fs::create_dir_all(fx.host("/l/b/d")).unwrap();
    std::fs::write(fx.host("/l/a.txt"), b"a").unwrap();
    std::fs::write(fx.host("/l/b/c.txt"), b"c").unwrap();
    std::fs::write(fx.host("/l/b/d/e.txt"), b"e").unwrap();
    symlink("b", fx.host("/l/link")).unwrap();
    let o = call(&fx.files, req_list("/l", 1), None).await;
    assert_eq!(entries(&o), ["/l/a.txt", "/l/b", "/l/link"]);
    let Reply::Entries { entries: e } = o.only() else { unreachable!() };
    assert_eq!((e[0].kind, e[0].size, e[0].name.as_str()), (FileType::File, 1, "a.txt"));
    assert_eq!(e[1].kind, FileType::Dir);
    assert_eq!((e[2].kind, e[2].target.as_deref()), (FileType::Symlink, Some("b")));
    let o = call(&fx.files, req_list("/l", 2), None).await;
    assert_eq!(entries(&o), ["/l/a.txt", "/l/b", "/l/b/c.txt", "/l/b/d", "/l/link"]);
    let o = call(&fx.files, req_list("/l/link/", 1), None).await;
    assert_eq!(entries(&o), ["/l/link/c.txt", "/l/link/d"]);
    let o = call(&fx.files, req_list("/", 1), None).await;
    assert_eq!(entries(&o), ["/home", "/l"]);
    assert_eq!(call(&fx.files, req_list("/l", 0), None).await.error().0, ErrorCode::InvalidArgument);
    assert_eq!(call(&fx.files, req_list("/l/a.txt", 1), None).await.error().0, ErrorCode::NotADirectory);
    assert_eq!(call(&fx.files, req_list("/nope", 1), None).await.error().0, ErrorCode::NotFound);
}

#[tokio::test]
async fn list_refuses_more_than_the_cap() {
    let fx = Fixture::new();
    std::fs::create_dir_all(fx.host("/many")).unwrap();
    for i in 0..MAX_ENTRIES {
        std::fs::write(fx.host(&format!("/many/{i}")), b"").unwrap();
    }
    assert_eq!(entries(&call(&fx.files, req_list("/many", 1), None).await).len(), MAX_ENTRIES);
    std::fs::write(fx.host("/many/one-more"), b"").unwrap();
    let (code, msg) = call(&fx.files, req_list("/many", 1), None).await.error();
    assert_eq!(code, ErrorCode::InvalidArgument);
    assert!(msg.contains("more than 10000 entries"), "{msg}");
}

#[tokio::test]
async fn remove_recursive_does_not_follow_symlinks() {
    let fx = Fixture::new();
    let outside = fx.outside("keep");
    std::fs::create_dir_all(outside.join("sub")).unwrap();
    std::fs::write(outside.join("sub/keep.txt"), b"keep").unwrap();
    std::fs::create_dir_all(fx.host("/victim/sub/deeper")).unwrap();
    std::fs::write(fx.host("/victim/f"), b"f").unwrap();
    std::fs::write(fx.host("/victim/sub/deeper/g"), b"g").unwrap();
    symlink(&outside, fx.host("/victim/abs-link")).unwrap();
    symlink("../../keep", fx.host("/victim/sub/rel-link")).unwrap();
    symlink(&outside, fx.host("/dirlink")).unwrap();

    let rm = |p: &str, recursive| Request::Remove { path: p.into(), recursive };
    // A link to a directory is removed as the link, recursive or not.
    assert_eq!(call(&fx.files, rm("/dirlink", true), None).await.only(), &Reply::Ok);
    assert!(std::fs::symlink_metadata(fx.host("/dirlink")).is_err());
    assert_eq!(call(&fx.files, rm("/victim", false), None).await.error().0, ErrorCode::NotEmpty);
    assert_eq!(call(&fx.files, rm("/victim", true), None).await.only(), &Reply::Ok);
    assert!(!fx.host("/victim").exists());
    assert_eq!(std::fs::read(outside.join("sub/keep.txt")).unwrap(), b"keep");
    std::fs::create_dir(fx.host("/empty")).unwrap();
    assert_eq!(call(&fx.files, rm("/empty", false), None).await.only(), &Reply::Ok);
    assert_eq!(call(&fx.files, rm("/empty", false), None).await.error().0, ErrorCode::NotFound);
    assert_eq!(call(&fx.files, rm("/", true), None).await.error().0, ErrorCode::InvalidArgument);
    assert_eq!(call(&fx.files, rm("/..", true), None).await.error().0, ErrorCode::InvalidArgument);
    assert!(fx.host("/home/user").is_dir());
}

#[tokio::test]
async fn rename_moves_files_and_dirs() {
    let fx = Fixture::new();
    write(&fx.files, "/a.txt", b"abc").await.info();
    std::fs::create_dir(fx.host("/sub")).unwrap();
    let fi = call(&fx.files, Request::Rename { from: "/a.txt".into(), to: "/sub/b.txt".into() }, None).await.info();
    assert_eq!((fi.path.as_str(), fi.name.as_str(), fi.size), ("/sub/b.txt", "b.txt", 3));
    assert!(!fx.host("/a.txt").exists());
    assert_eq!(read_ok(&fx.files, "/sub/b.txt").await, b"abc");
    let fi = call(&fx.files, Request::Rename { from: "/sub".into(), to: "notes".into() }, None).await.info();
    assert_eq!((fi.path.as_str(), fi.kind), ("/home/user/notes", FileType::Dir));
    let (code, msg) = call(&fx.files, Request::Rename { from: "/gone".into(), to: "/x".into() }, None).await.error();
    assert_eq!((code, msg.as_str()), (ErrorCode::NotFound, "rename /gone to /x: no such file or directory"));
    let o = call(&fx.files, Request::Rename { from: "/".into(), to: "/x".into() }, None).await;
    assert_eq!(o.error().0, ErrorCode::InvalidArgument);
}

#[tokio::test]
async fn mkdir_with_and_without_parents() {
    let fx = Fixture::new();
    let mk = |p: &str, parents| Request::MakeDir { path: p.into(), parents, owner: None };
    let fi = call(&fx.files, mk("/x/y/z", true), None).await.info();
    assert_eq!((fi.path.as_str(), fi.name.as_str(), fi.kind, fi.mode), ("/x/y/z", "z", FileType::Dir, 0o755));
    assert!(fx.host("/x/y/z").is_dir());
    assert_eq!(call(&fx.files, mk("/x/y/z", true), None).await.info().kind, FileType::Dir);
    assert_eq!(call(&fx.files, mk("/x/y/z", false), None).await.error().0, ErrorCode::AlreadyExists);
    assert_eq!(call(&fx.files, mk("/q/r", false), None).await.error().0, ErrorCode::NotFound);
    assert_eq!(call(&fx.files, mk("/", true), None).await.info().path, "/");
    assert_eq!(call(&fx.files, mk("/", false), None).await.error().0, ErrorCode::AlreadyExists);
    std::fs::write(fx.host("/file"), b"").unwrap();
    assert_eq!(call(&fx.files, mk("/file", true), None).await.error().0, ErrorCode::AlreadyExists);
    assert_eq!(call(&fx.files, mk("/file/sub", true), None).await.error().0, ErrorCode::NotADirectory);
    assert_eq!(call(&fx.files, mk("rel", false), None).await.info().path, "/home/user/rel");
    assert!(fx.host("/home/user/rel").is_dir());
}

#[tokio::test]
async fn stat_reports_symlinks_without_following() {
    let fx = Fixture::new();
    std::fs::write(fx.host("/t.txt"), b"12345").unwrap();
    symlink("t.txt", fx.host("/ln")).unwrap();
    symlink("/nowhere", fx.host("/dangling")).unwrap();
    let st = |p: &str| Request::Stat { path: p.into() };
    let fi = call(&fx.files, st("/ln"), None).await.info();
    assert_eq!((fi.kind, fi.target.as_deref(), fi.path.as_str()), (FileType::Symlink, Some("t.txt"), "/ln"));
    let fi = call(&fx.files, st("/dangling"), None).await.info();
    assert_eq!((fi.kind, fi.target.as_deref()), (FileType::Symlink, Some("/nowhere")));
    let fi = call(&fx.files, st("/t.txt"), None).await.info();
    assert_eq!((fi.kind, fi.size, fi.target), (FileType::File, 5, None));
    let fi = call(&fx.files, st("/"), None).await.info();
    assert_eq!((fi.kind, fi.path.as_str()), (FileType::Dir, "/"));
    assert_eq!(call(&fx.files, st("/nope"), None).await.error().0, ErrorCode::NotFound);
    // Reading through the link follows it (inside the root).
    assert_eq!(read_ok(&fx.files, "/ln").await, b"12345");
}

#[tokio::test]
async fn non_file_requests_are_protocol_errors() {
    let fx = Fixture::new();
    assert_eq!(call(&fx.files, Request::EndData, None).await.error().0, ErrorCode::Protocol);
}

#[tokio::test]
async fn owner_and_xattrs_of_new_files() {
    use std::os::unix::fs::MetadataExt;
    let fx = Fixture::new();
    let owner = Some(Owner { uid: 1234, gid: 2345 });
    let xattrs: BTreeMap<String, String> = [("user.e2b.author".to_string(), "mish".to_string())].into();
    let req =
        Request::WriteFile { path: "/new/dir/f".into(), mode: None, parents: true, owner, xattrs: xattrs.clone() };
    let fi = call(&fx.files, req, Some(b"x")).await.info();
    assert_eq!((fi.uid, fi.gid, &fi.xattrs), (1234, 2345, &xattrs));
    for made in ["/new", "/new/dir", "/new/dir/f"] {
        let md = std::fs::metadata(fx.host(made)).unwrap();
        assert_eq!((md.uid(), md.gid()), (1234, 2345), "{made}");
    }
    // Stat and listing show the attributes; a rename keeps them.
    assert_eq!(call(&fx.files, Request::Stat { path: "/new/dir/f".into() }, None).await.info().xattrs, xattrs);
    let req = Request::Rename { from: "/new/dir/f".into(), to: "/new/dir/g".into() };
    assert_eq!(call(&fx.files, req, None).await.info().xattrs, xattrs);
    match call(&fx.files, Request::ListDir { path: "/new/dir".into(), depth: 1 }, None).await.only() {
        Reply::Entries { entries } => assert_eq!(entries[0].xattrs, xattrs),
        other => panic!("{other:?}"),
    }
    // Overwriting without attributes leaves none behind.
    assert!(write(&fx.files, "/new/dir/g", b"y").await.info().xattrs.is_empty());
    // Only the user. namespace can be set.
    let bad: BTreeMap<String, String> = [("trusted.x".to_string(), "v".to_string())].into();
    let req = Request::WriteFile { path: "/h".into(), mode: None, parents: false, owner: None, xattrs: bad };
    assert_eq!(call(&fx.files, req, Some(b"x")).await.error().0, ErrorCode::InvalidArgument);
    assert!(!fx.host("/h").exists());
    // A directory made with an owner.
    let fi = call(&fx.files, Request::MakeDir { path: "/d2".into(), parents: false, owner }, None).await.info();
    assert_eq!((fi.uid, fi.gid), (1234, 2345));
}
