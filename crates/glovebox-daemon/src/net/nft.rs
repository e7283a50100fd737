//! nf_tables over nfnetlink: the daemon's table, its base chains and each sandbox's chains,
//! programmed in process as batches. A batch is one kernel transaction: a sandbox's rules
//! are replaced all at once or not at all.
//!
//! A table (`inet glovebox_<pid>`, and each of its shards), as `nft list` shows it:
//! - set `ifaces` (this daemon's links), verdict maps `out`, `in`, `nat` (link → its chain);
//! - `prerouting` (nat): own links jump to their `sbN_nat` (redirect to the proxy);
//! - `forward` (filter): own links jump to their `sbN`, which always ends in a verdict;
//!   traffic to own links passes only as replies (established, related);
//! - `input` (filter): from own links, replies pass, then `sbN_in` (the host end's
//!   services), then drop;
//! - `postrouting` (nat): own links' traffic leaving by another interface is masqueraded.
//!
//! `forward` and `input` first let by (return) a packet that has no own link in it: a daemon
//! may have several such tables (`net::SHARD_LINKS`), and every packet on the host passes each;
//! one that neither comes from nor goes to a sandbox does fewer lookups so.

use std::net::Ipv4Addr;

use rustix::net::netlink::NETFILTER;

use super::netlink::{attrs, Batch, NlError, Socket, NLA_F_NESTED, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_DUMP};
use super::ruleset::{Redirect, Rule, Ruleset, Service, Verdict, L4};
use glovebox_proto::policy::Net4;

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NFNL_MSG_BATCH_END: u16 = 17;

const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;

const NFPROTO_INET: u8 = 1;
const NFPROTO_IPV4: u8 = 2;

const NFTA_TABLE_NAME: u16 = 1;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_DATA_TYPE: u16 = 6;
const NFTA_SET_ID: u16 = 10;
const NFTA_SET_USERDATA: u16 = 13;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;

const NFT_SET_MAP: u32 = 0x8;
const NFT_DATA_VERDICT: u32 = 0xffff_ff00;
/// nft's name for the ifname type (userspace only: it lets `nft list` print the keys).
const TYPE_IFNAME: u32 = 41;
const IFNAMSIZ: usize = 16;

/// nft's user data for a set (type 0 "key byte order", length 4, 1 "host"): the keys are
/// names as written; without it `nft list` would print them reversed (as empty strings).
fn set_userdata() -> [u8; 6] {
    let host = 1u32.to_ne_bytes();
    [0, 4, host[0], host[1], host[2], host[3]]
}

const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
const NFT_JUMP: u32 = -3i32 as u32;
const NFT_RETURN: u32 = -5i32 as u32;

const NF_INET_PRE_ROUTING: u32 = 0;
const NF_INET_LOCAL_IN: u32 = 1;
const NF_INET_FORWARD: u32 = 2;
const NF_INET_POST_ROUTING: u32 = 4;

const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_REG_2: u32 = 2;

const NFT_META_IIFNAME: u32 = 6;
const NFT_META_OIFNAME: u32 = 7;
const NFT_META_NFPROTO: u32 = 15;
const NFT_META_L4PROTO: u32 = 16;
const NFT_CMP_EQ: u32 = 0;
const NFT_CMP_NEQ: u32 = 1;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
const NFT_LOOKUP_F_INV: u32 = 1;
const NFT_CT_STATE: u32 = 0;
/// `ct state established,related`.
const CT_ESTABLISHED_RELATED: u32 = 2 | 4;
/// `ct state new`.
const CT_NEW: u32 = 8;
const NFT_REJECT_TCP_RST: u32 = 1;
const NFT_REJECT_ICMPX_UNREACH: u32 = 2;
const NFT_REJECT_ICMPX_PORT_UNREACH: u8 = 1;
const NFT_NAT_DNAT: u32 = 1;

/// A batch of nf_tables messages for one table.
struct Tx<'a> {
    b: Batch,
    table: &'a str,
}

/// `struct nfgenmsg`: family, version 0, resource id (big endian).
fn nfgenmsg(family: u8, res_id: u16) -> [u8; 4] {
    let r = res_id.to_be_bytes();
    [family, 0, r[0], r[1]]
}

fn nft_type(msg: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | msg
}

/// An interface name as a key: NUL padded to IFNAMSIZ.
fn ifkey(name: &str) -> [u8; IFNAMSIZ] {
    let mut k = [0u8; IFNAMSIZ];
    let n = name.len().min(IFNAMSIZ - 1);
    k[..n].copy_from_slice(&name.as_bytes()[..n]);
    k
}

fn mask(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix))
    }
}

impl<'a> Tx<'a> {
    fn new(table: &'a str) -> Tx<'a> {
        let mut b = Batch::new();
        b.begin(NFNL_MSG_BATCH_BEGIN, 0, "batch").raw(&nfgenmsg(0, NFNL_SUBSYS_NFTABLES)).end();
        Tx { b, table }
    }

    fn msg(&mut self, ty: u16, flags: u16, what: String) -> &mut Batch {
        self.b.begin(nft_type(ty), flags | NLM_F_ACK, what).raw(&nfgenmsg(NFPROTO_INET, 0))
    }

    /// Sends the batch as one transaction.
    fn commit(mut self) -> Result<(), NlError> {
        self.b.begin(NFNL_MSG_BATCH_END, 0, "batch").raw(&nfgenmsg(0, NFNL_SUBSYS_NFTABLES)).end();
        Socket::open(Some(NETFILTER))?.request(&self.b)
    }

    fn new_table(&mut self) {
        let t = self.table;
        self.msg(NFT_MSG_NEWTABLE, NLM_F_CREATE, format!("create table {t}")).str(NFTA_TABLE_NAME, t).end();
    }

    fn del_table(&mut self) {
        let t = self.table;
        self.msg(NFT_MSG_DELTABLE, 0, format!("delete table {t}")).str(NFTA_TABLE_NAME, t).end();
    }

    /// A chain; with `hook`, a base chain of `kind` ("filter", "nat") at `priority`.
    fn new_chain(&mut self, name: &str, hook: Option<(&str, u32, i32)>) {
        let t = self.table;
        let b = self.msg(NFT_MSG_NEWCHAIN, NLM_F_CREATE, format!("create chain {name}"));
        b.str(NFTA_CHAIN_TABLE, t).str(NFTA_CHAIN_NAME, name);
        if let Some((kind, hooknum, priority)) = hook {
            b.open(NFTA_CHAIN_HOOK | NLA_F_NESTED)
                .be32(NFTA_HOOK_HOOKNUM, hooknum)
                .be32(NFTA_HOOK_PRIORITY, priority as u32)
                .close()
                .str(NFTA_CHAIN_TYPE, kind)
                .be32(NFTA_CHAIN_POLICY, NF_ACCEPT);
        }
        b.end();
    }

    fn flush_chain(&mut self, name: &str) {
        let t = self.table;
        self.msg(NFT_MSG_DELRULE, 0, format!("flush chain {name}"))
            .str(NFTA_RULE_TABLE, t)
            .str(NFTA_RULE_CHAIN, name)
            .end();
    }

    fn del_chain(&mut self, name: &str) {
        let t = self.table;
        self.msg(NFT_MSG_DELCHAIN, 0, format!("delete chain {name}"))
            .str(NFTA_CHAIN_TABLE, t)
            .str(NFTA_CHAIN_NAME, name)
            .end();
    }

    /// A set of interface names, or (`map`) a map from them to verdicts.
    fn new_set(&mut self, name: &str, id: u32, map: bool) {
        let t = self.table;
        let b = self.msg(NFT_MSG_NEWSET, NLM_F_CREATE, format!("create set {name}"));
        b.str(NFTA_SET_TABLE, t)
            .str(NFTA_SET_NAME, name)
            .be32(NFTA_SET_FLAGS, if map { NFT_SET_MAP } else { 0 })
            .be32(NFTA_SET_KEY_TYPE, TYPE_IFNAME)
            .be32(NFTA_SET_KEY_LEN, IFNAMSIZ as u32);
        if map {
            b.be32(NFTA_SET_DATA_TYPE, NFT_DATA_VERDICT);
        }
        b.be32(NFTA_SET_ID, id).attr(NFTA_SET_USERDATA, &set_userdata()).end();
    }

    /// Adds (or deletes) `dev` to set `set`; for maps, with a jump to `chain`.
    fn element(&mut self, add: bool, set: &str, dev: &str, chain: Option<&str>) {
        let t = self.table;
        let (ty, flags, verb) =
            if add { (NFT_MSG_NEWSETELEM, NLM_F_CREATE, "add") } else { (NFT_MSG_DELSETELEM, 0, "delete") };
        let b = self.msg(ty, flags, format!("{verb} {dev} in {set}"));
        b.str(NFTA_SET_ELEM_LIST_TABLE, t)
            .str(NFTA_SET_ELEM_LIST_SET, set)
            .open(NFTA_SET_ELEM_LIST_ELEMENTS | NLA_F_NESTED)
            .open(NFTA_LIST_ELEM | NLA_F_NESTED)
            .open(NFTA_SET_ELEM_KEY | NLA_F_NESTED)
            .attr(NFTA_DATA_VALUE, &ifkey(dev))
            .close();
        if let (true, Some(c)) = (add, chain) {
            b.open(NFTA_SET_ELEM_DATA | NLA_F_NESTED)
                .open(NFTA_DATA_VERDICT | NLA_F_NESTED)
                .be32(NFTA_VERDICT_CODE, NFT_JUMP)
                .str(NFTA_VERDICT_CHAIN, c)
                .close()
                .close();
        }
        b.close().close().end();
    }

    /// Appends a rule of `exprs` to `chain`.
    fn rule(&mut self, chain: &str, exprs: &[Expr]) {
        let t = self.table;
        let b = self.msg(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, format!("add rule to {chain}"));
        b.str(NFTA_RULE_TABLE, t).str(NFTA_RULE_CHAIN, chain).open(NFTA_RULE_EXPRESSIONS | NLA_F_NESTED);
        for e in exprs {
            b.open(NFTA_LIST_ELEM | NLA_F_NESTED);
            e.encode(b);
            b.close();
        }
        b.close().end();
    }
}

/// One nf_tables expression.
#[derive(Clone)]
enum Expr<'a> {
    /// Loads a meta key into register 1.
    Meta(u32),
    /// Compares register 1 with the bytes.
    Cmp(u32, Vec<u8>),
    /// Loads `len` bytes at `offset` of header `base` into register 1.
    Payload {
        base: u32,
        offset: u32,
        len: u32,
    },
    /// Register 1 &= mask (4 bytes).
    Mask([u8; 4]),
    /// Register 1 in (or, inverted, not in) set; into a map: the verdict it maps to.
    Lookup {
        set: &'a str,
        invert: bool,
        verdict: bool,
    },
    /// Loads the conntrack state into register 1.
    CtState,
    /// Sets the verdict (a chain with a jump).
    Verdict(u32, Option<&'a str>),
    /// Loads the bytes into a register.
    Load(u32, Vec<u8>),
    Reject {
        tcp: bool,
    },
    /// Destination NAT to the address in register 1 and the port in register 2.
    Dnat,
    Masquerade,
    /// Packets and bytes that reached it (what `nft list` shows as `counter`).
    Counter,
    /// Copies the packet's first `nflog::SNAPLEN` bytes to netlink log group `group`.
    Log {
        group: u16,
        prefix: &'static str,
    },
}

impl Expr<'_> {
    fn encode(&self, b: &mut Batch) {
        let name = match self {
            Expr::Meta(_) => "meta",
            Expr::Cmp(..) => "cmp",
            Expr::Payload { .. } => "payload",
            Expr::Mask(_) => "bitwise",
            Expr::Lookup { .. } => "lookup",
            Expr::CtState => "ct",
            Expr::Verdict(..) | Expr::Load(..) => "immediate",
            Expr::Reject { .. } => "reject",
            Expr::Dnat => "nat",
            Expr::Masquerade => "masq",
            Expr::Counter => "counter",
            Expr::Log { .. } => "log",
        };
        b.str(NFTA_EXPR_NAME, name).open(NFTA_EXPR_DATA | NLA_F_NESTED);
        match self {
            // NFTA_META_DREG, NFTA_META_KEY
            Expr::Meta(key) => {
                b.be32(2, *key).be32(1, NFT_REG_1);
            }
            // NFTA_CMP_SREG, NFTA_CMP_OP, NFTA_CMP_DATA
            Expr::Cmp(op, data) => {
                b.be32(1, NFT_REG_1).be32(2, *op).open(3 | NLA_F_NESTED).attr(NFTA_DATA_VALUE, data).close();
            }
            // NFTA_PAYLOAD_DREG, _BASE, _OFFSET, _LEN
            Expr::Payload { base, offset, len } => {
                b.be32(1, NFT_REG_1).be32(2, *base).be32(3, *offset).be32(4, *len);
            }
            // NFTA_BITWISE_SREG, _DREG, _LEN, _MASK, _XOR
            Expr::Mask(m) => {
                b.be32(1, NFT_REG_1)
                    .be32(2, NFT_REG_1)
                    .be32(3, 4)
                    .open(4 | NLA_F_NESTED)
                    .attr(NFTA_DATA_VALUE, m)
                    .close()
                    .open(5 | NLA_F_NESTED)
                    .attr(NFTA_DATA_VALUE, &[0; 4])
                    .close();
            }
            // NFTA_LOOKUP_SET, _SREG, _DREG, _FLAGS
            Expr::Lookup { set, invert, verdict } => {
                b.str(1, set).be32(2, NFT_REG_1);
                if *verdict {
                    b.be32(3, NFT_REG_VERDICT);
                }
                if *invert {
                    b.be32(5, NFT_LOOKUP_F_INV);
                }
            }
            // NFTA_CT_DREG, NFTA_CT_KEY
            Expr::CtState => {
                b.be32(1, NFT_REG_1).be32(2, NFT_CT_STATE);
            }
            // NFTA_IMMEDIATE_DREG, NFTA_IMMEDIATE_DATA
            Expr::Verdict(code, chain) => {
                b.be32(1, NFT_REG_VERDICT).open(2 | NLA_F_NESTED).open(NFTA_DATA_VERDICT | NLA_F_NESTED);
                b.be32(NFTA_VERDICT_CODE, *code);
                if let Some(c) = chain {
                    b.str(NFTA_VERDICT_CHAIN, c);
                }
                b.close().close();
            }
            Expr::Load(reg, data) => {
                b.be32(1, *reg).open(2 | NLA_F_NESTED).attr(NFTA_DATA_VALUE, data).close();
            }
            // NFTA_REJECT_TYPE, NFTA_REJECT_ICMP_CODE
            Expr::Reject { tcp: true } => {
                b.be32(1, NFT_REJECT_TCP_RST);
            }
            Expr::Reject { tcp: false } => {
                b.be32(1, NFT_REJECT_ICMPX_UNREACH).attr(2, &[NFT_REJECT_ICMPX_PORT_UNREACH]);
            }
            // NFTA_NAT_TYPE, _FAMILY, _REG_ADDR_MIN, _REG_PROTO_MIN
            Expr::Dnat => {
                b.be32(1, NFT_NAT_DNAT).be32(2, u32::from(NFPROTO_IPV4)).be32(3, NFT_REG_1).be32(5, NFT_REG_2);
            }
            // NFTA_LOG_GROUP (big-endian u16), NFTA_LOG_PREFIX, NFTA_LOG_SNAPLEN
            Expr::Log { group, prefix } => {
                b.attr(1, &group.to_be_bytes()).str(2, prefix).be32(3, super::nflog::SNAPLEN);
            }
            Expr::Masquerade | Expr::Counter => {}
        }
        b.close();
    }
}

fn iifname_in(set: &str) -> [Expr<'_>; 2] {
    [Expr::Meta(NFT_META_IIFNAME), Expr::Lookup { set, invert: false, verdict: false }]
}

fn ipv4() -> [Expr<'static>; 2] {
    [Expr::Meta(NFT_META_NFPROTO), Expr::Cmp(NFT_CMP_EQ, vec![NFPROTO_IPV4])]
}

/// `ip daddr <net>` (with the IPv4 check it depends on in an inet table).
fn daddr(net: Net4) -> Vec<Expr<'static>> {
    let mut v = ipv4().into_iter().collect::<Vec<_>>();
    v.push(Expr::Payload { base: NFT_PAYLOAD_NETWORK_HEADER, offset: 16, len: 4 });
    let m = mask(net.prefix);
    if m != u32::MAX {
        v.push(Expr::Mask(m.to_be_bytes()));
    }
    v.push(Expr::Cmp(NFT_CMP_EQ, (u32::from(net.addr) & m).to_be_bytes().to_vec()));
    v
}

/// `meta l4proto <l4>` and, with a port, `<l4> dport <port>`.
fn l4(proto: L4, port: Option<u16>) -> Vec<Expr<'static>> {
    let mut v = vec![Expr::Meta(NFT_META_L4PROTO), Expr::Cmp(NFT_CMP_EQ, vec![proto.number()])];
    if let Some(p) = port {
        v.push(Expr::Payload { base: NFT_PAYLOAD_TRANSPORT_HEADER, offset: 2, len: 2 });
        v.push(Expr::Cmp(NFT_CMP_EQ, p.to_be_bytes().to_vec()));
    }
    v
}

/// The rules enforcing `r`: with a log group, a denial is logged, and so is the first
/// packet of each connection an address rule accepts (a rule of its own before the accept,
/// matching `ct state new`).
fn out_rules(r: &Rule, log: Option<u16>) -> Vec<Vec<Expr<'static>>> {
    let mut v = match r.to {
        Some(n) => daddr(n),
        // Sandboxes have no IPv6: "anything" accepted means any IPv4.
        None if r.verdict == Verdict::Accept => ipv4().into_iter().collect(),
        None => Vec::new(),
    };
    if let Some(p) = r.l4 {
        v.extend(l4(p, r.port));
    }
    let mut rules = Vec::new();
    match (log, r.verdict) {
        (Some(group), Verdict::Accept) => {
            let mut first = v.clone();
            first.extend([
                Expr::CtState,
                Expr::Mask(CT_NEW.to_ne_bytes()),
                Expr::Cmp(NFT_CMP_NEQ, 0u32.to_ne_bytes().to_vec()),
                Expr::Log { group, prefix: super::nflog::PREFIX_ALLOWED },
            ]);
            rules.push(first);
        }
        (Some(group), _) => v.push(Expr::Log { group, prefix: super::nflog::PREFIX_DENIED }),
        (None, _) => {}
    }
    // CIDR-routed traffic is also counted (docs/network.md).
    v.push(Expr::Counter);
    v.push(match r.verdict {
        Verdict::Accept => Expr::Verdict(NF_ACCEPT, None),
        Verdict::Reject => Expr::Reject { tcp: false },
        Verdict::Reset => Expr::Reject { tcp: true },
    });
    rules.push(v);
    rules
}

fn service_rule(host: Ipv4Addr, s: &Service) -> Vec<Expr<'static>> {
    let mut v = daddr(Net4 { addr: host, prefix: 32 });
    v.extend(l4(s.l4, Some(s.port)));
    v.push(Expr::Verdict(NF_ACCEPT, None));
    v
}

fn redirect_rules(host: Ipv4Addr, r: &Redirect) -> Vec<Vec<Expr<'static>>> {
    let mut rules = Vec::new();
    for n in std::iter::once(Net4 { addr: host, prefix: 32 }).chain(r.direct.iter().copied()) {
        let mut v = daddr(n);
        v.push(Expr::Verdict(NFT_RETURN, None));
        rules.push(v);
    }
    for p in &r.ports {
        let mut v = ipv4().into_iter().collect::<Vec<_>>();
        v.extend(l4(L4::Tcp, Some(*p)));
        v.push(Expr::Load(NFT_REG_1, host.octets().to_vec()));
        v.push(Expr::Load(NFT_REG_2, r.to_port.to_be_bytes().to_vec()));
        v.push(Expr::Dnat);
        rules.push(v);
    }
    rules
}

/// Creates `table` afresh (a table of that name, left by an earlier process with this pid,
/// is replaced) with its sets, maps and base chains.
pub fn create_table(table: &str) -> Result<(), NlError> {
    let mut tx = Tx::new(table);
    tx.new_table();
    tx.del_table();
    tx.new_table();
    for (id, (set, map)) in [("ifaces", false), ("out", true), ("in", true), ("nat", true)].into_iter().enumerate() {
        tx.new_set(set, id as u32 + 1, map);
    }
    tx.new_chain("prerouting", Some(("nat", NF_INET_PRE_ROUTING, -100)));
    tx.new_chain("forward", Some(("filter", NF_INET_FORWARD, 0)));
    tx.new_chain("input", Some(("filter", NF_INET_LOCAL_IN, 0)));
    tx.new_chain("postrouting", Some(("nat", NF_INET_POST_ROUTING, 100)));
    let vmap = |set| [Expr::Meta(NFT_META_IIFNAME), Expr::Lookup { set, invert: false, verdict: true }];
    let established = [
        Expr::CtState,
        Expr::Mask(CT_ESTABLISHED_RELATED.to_ne_bytes()),
        Expr::Cmp(NFT_CMP_NEQ, 0u32.to_ne_bytes().to_vec()),
        Expr::Verdict(NF_ACCEPT, None),
    ];
    let oifname_in = [Expr::Meta(NFT_META_OIFNAME), Expr::Lookup { set: "ifaces", invert: false, verdict: false }];
    let then =
        |a: &[Expr<'static>], b: &[Expr<'static>]| -> Vec<Expr<'static>> { a.iter().chain(b).cloned().collect() };
    let drop = [Expr::Verdict(NF_DROP, None)];
    // A packet passes every shard's base chains (see `net::SHARD_LINKS`): one that neither comes
    // from nor goes to a link of this table leaves each chain after one or two set lookups.
    let not_in = |meta| [Expr::Meta(meta), Expr::Lookup { set: "ifaces", invert: true, verdict: false }];
    let pass = [Expr::Verdict(NFT_RETURN, None)];
    tx.rule("prerouting", &then(&iifname_in("ifaces"), &vmap("nat")));
    tx.rule("forward", &then(&not_in(NFT_META_IIFNAME), &then(&not_in(NFT_META_OIFNAME), &pass)));
    tx.rule("forward", &then(&iifname_in("ifaces"), &vmap("out")));
    tx.rule("forward", &then(&iifname_in("ifaces"), &drop));
    tx.rule("forward", &then(&oifname_in, &established));
    tx.rule("forward", &then(&oifname_in, &drop));
    tx.rule("input", &then(&not_in(NFT_META_IIFNAME), &pass));
    tx.rule("input", &then(&iifname_in("ifaces"), &established));
    tx.rule("input", &then(&iifname_in("ifaces"), &vmap("in")));
    tx.rule("input", &then(&iifname_in("ifaces"), &drop));
    tx.rule("postrouting", &then(&iifname_in("ifaces"), &then(&not_in(NFT_META_OIFNAME), &[Expr::Masquerade])));
    tx.commit()
}

/// Replaces the chains of the sandbox on link `dev` (host end `host`) with `rules`, in one
/// transaction; `first` also enters the link into the dispatch sets. With `log`, the
/// outbound rules log to that netlink group (`nflog`).
pub fn apply(
    table: &str,
    dev: &str,
    chain: &str,
    host: Ipv4Addr,
    rules: &Ruleset,
    first: bool,
    log: Option<u16>,
) -> Result<(), NlError> {
    let mut tx = Tx::new(table);
    let (c_in, c_nat) = (format!("{chain}_in"), format!("{chain}_nat"));
    for c in [chain, &c_in, &c_nat] {
        tx.new_chain(c, None);
        tx.flush_chain(c);
    }
    for r in &rules.out {
        for e in out_rules(r, log) {
            tx.rule(chain, &e);
        }
    }
    for s in &rules.services {
        tx.rule(&c_in, &service_rule(host, s));
    }
    if let Some(r) = &rules.redirect {
        for e in redirect_rules(host, r) {
            tx.rule(&c_nat, &e);
        }
    }
    if first {
        tx.element(true, "out", dev, Some(chain));
        tx.element(true, "in", dev, Some(&c_in));
        tx.element(true, "nat", dev, Some(&c_nat));
        tx.element(true, "ifaces", dev, None);
    }
    tx.commit()
}

/// Enters (`add`) or removes link `dev` in the `ifaces` set alone: an own link that no
/// verdict map names has everything it sends dropped by the base chains, so a link made
/// ahead is held shut until [`apply`] gives it its chains. Additions only, unlike replacing
/// rules, which costs the kernel a grace period per commit.
pub fn hold(table: &str, dev: &str, add: bool) -> Result<(), NlError> {
    let mut tx = Tx::new(table);
    tx.element(add, "ifaces", dev, None);
    tx.commit()
}

/// Removes the sandbox's dispatch entries and chains, in one transaction.
pub fn remove(table: &str, dev: &str, chain: &str) -> Result<(), NlError> {
    let mut tx = Tx::new(table);
    for set in ["ifaces", "out", "in", "nat"] {
        tx.element(false, set, dev, None);
    }
    for c in [chain.to_string(), format!("{chain}_in"), format!("{chain}_nat")] {
        tx.del_chain(&c);
    }
    tx.commit()
}

pub fn delete_table(table: &str) -> Result<(), NlError> {
    let mut tx = Tx::new(table);
    tx.del_table();
    tx.commit()
}

/// The names of the host's `inet` tables.
pub fn inet_tables() -> Result<Vec<String>, NlError> {
    let mut b = Batch::new();
    b.begin(nft_type(NFT_MSG_GETTABLE), NLM_F_DUMP, "list tables").raw(&nfgenmsg(NFPROTO_INET, 0)).end();
    let answers = Socket::open(Some(NETFILTER))?.dump(&b)?;
    Ok(answers
        .iter()
        .filter(|p| p.first() == Some(&NFPROTO_INET))
        .filter_map(|p| {
            let (_, name) = attrs(p.get(4..)?).into_iter().find(|(t, _)| *t == NFTA_TABLE_NAME)?;
            Some(String::from_utf8_lossy(name.split(|c| *c == 0).next().unwrap_or_default()).into_owned())
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_masks_are_what_the_kernel_compares() {
        assert_eq!(&ifkey("gb12")[..5], b"gb12\0");
        assert_eq!(mask(24), 0xffff_ff00);
        assert_eq!(mask(0), 0);
        // An allow of a whole /32 needs no mask; any shorter prefix does.
        assert_eq!(daddr(Net4::new(198, 51, 100, 7, 32)).len(), 4);
        assert_eq!(daddr(Net4::new(198, 51, 100, 0, 24)).len(), 5);
    }

    #[test]
    fn a_table_takes_rules_and_goes() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let table = format!("glovebox_test_{}", std::process::id());
        create_table(&table).expect("create table");
        assert!(inet_tables().expect("list").contains(&table));
        let p = glovebox_proto::policy::parse(
            &serde_json::from_value(serde_json::json!({
                "mode": "allow-list",
                "allow": ["198.51.100.0/24:443", "api.example.test"],
                "deny": ["198.51.100.7/32"],
            }))
            .expect("policy json"),
        )
        .expect("policy");
        let host = Ipv4Addr::new(10, 213, 255, 253);
        apply(&table, "gbtest0", "sb0", host, &super::super::ruleset(&p), true, Some(4242)).expect("first apply");
        apply(
            &table,
            "gbtest0",
            "sb0",
            host,
            &super::super::ruleset(&glovebox_proto::policy::Policy::deny_all()),
            false,
            None,
        )
        .expect("replace");
        remove(&table, "gbtest0", "sb0").expect("remove");
        delete_table(&table).expect("delete table");
        assert!(!inet_tables().expect("list").contains(&table));
    }
}
