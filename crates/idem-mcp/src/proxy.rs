//! [`Proxy`]: the MCP server the client talks to, holding an rmcp client of the upstream.
//!
//! `tools/list` is forwarded and each tool classified ([`crate::policy`]); effect tools get the
//! `idempotency_key` property ([`crate::schema`]). `tools/call` of an effect tool goes through
//! the [`Guard`]; read and idempotent tools pass straight through. Prompts, resources and
//! completions are forwarded as they are. Notifications from the upstream (list changes,
//! progress, logs) are not relayed: the proxy does not advertise `listChanged` or
//! subscriptions, so a client does not wait for them.
//!
//! One upstream connection serves every client of the proxy (over HTTP, every session): the
//! proxy sits in the upstream's trust domain, and the caller's identity matters only for the
//! scope of its keys.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use http::HeaderName;
use idem_core::{Fingerprint, Key, Outcome, ProblemType, Scope, Store, ToolClass};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResponse, ClientRequest, CompleteRequestParams,
    CompleteResult, ErrorData, GetPromptRequestParams, GetPromptResponse, Implementation,
    JsonObject, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse,
    RequestMetaObject, ServerCapabilities, ServerConfig, ServerResult, Tool,
};
use rmcp::service::{PeerRequestOptions, RequestContext, ServiceError};
use rmcp::{Peer, RoleClient, RoleServer, ServerHandler};

use crate::call::{Forwarded, Guard, refusal};
use crate::policy::Policies;
use crate::schema::{KEY_ARG, KeyArg, declares_key, take_key, with_key};

/// Whose keys a call's are ([design §8](docs/design.md#8-mcp)).
#[derive(Debug, Clone)]
pub enum ScopeBy {
    /// One configured scope: over stdio the principal is not a process, so a runtime that
    /// restarts and reconnects through a new proxy with the same key still gets its replay.
    Fixed(Scope),
    /// Over HTTP: a hash of these request headers, as the gateway computes it (anonymous when
    /// none is present).
    Headers(Vec<HeaderName>),
}

/// What the proxy knows of one upstream tool.
#[derive(Debug, Clone, Copy)]
struct Known {
    class: ToolClass,
    declares_key: bool,
}

/// The MCP server in front of the upstream.
#[derive(Debug)]
pub struct Proxy<S> {
    upstream: Peer<RoleClient>,
    info: ServerConfig,
    guard: Guard<S>,
    policies: Arc<Policies>,
    scope: ScopeBy,
    tools: Arc<RwLock<HashMap<String, Known>>>,
    /// When the upstream's tool list was last read.
    listed_at: Arc<RwLock<Option<Instant>>>,
}

/// How long a tool classed read or idempotent is passed through on what the last
/// `tools/list` said. Past it the list is read again first: an upstream redeployed with a
/// tool that now has side effects must not have it pass through without a key for long.
const TRUST_LISTING: Duration = Duration::from_secs(10);

impl<S: Clone> Clone for Proxy<S> {
    fn clone(&self) -> Self {
        Proxy {
            upstream: self.upstream.clone(),
            info: self.info.clone(),
            guard: self.guard.clone(),
            policies: self.policies.clone(),
            scope: self.scope.clone(),
            tools: self.tools.clone(),
            listed_at: self.listed_at.clone(),
        }
    }
}

impl<S: Store + Clone> Proxy<S> {
    /// A proxy of the connected `upstream`, keeping keys in `store`.
    pub fn new(upstream: Peer<RoleClient>, store: S, policies: Policies, scope: ScopeBy) -> Self {
        let info = server_config(&upstream);
        Proxy {
            upstream,
            info,
            guard: Guard::new(store),
            policies: Arc::new(policies),
            scope,
            tools: Arc::default(),
            listed_at: Arc::default(),
        }
    }

    /// Waits, at most `grace`, for effect calls still executing (see [`Guard::drain`]).
    pub async fn drain(&self, grace: std::time::Duration) {
        let left = self.guard.drain(grace).await;
        if left > 0 {
            tracing::warn!(
                left,
                "tool calls still running at shutdown; their keys will read as abandoned"
            );
        }
    }

    fn scope_of(&self, context: &RequestContext<RoleServer>) -> Scope {
        match &self.scope {
            ScopeBy::Fixed(s) => s.clone(),
            ScopeBy::Headers(names) => match context.extensions.get::<http::request::Parts>() {
                Some(parts) => Scope::from_headers(&parts.headers, names),
                None => Scope::anonymous(),
            },
        }
    }

    /// Classifies and rewrites the upstream's tools, remembering what it learnt.
    fn present(&self, tools: Vec<Tool>) -> Vec<Tool> {
        *self.listed_at.write().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        let mut known = self.tools.write().unwrap_or_else(|p| p.into_inner());
        tools
            .into_iter()
            .map(|tool| {
                let k = Known {
                    class: self.policies.classify(&tool),
                    declares_key: declares_key(&tool.input_schema),
                };
                known.insert(tool.name.to_string(), k);
                match k.class {
                    ToolClass::Effect => with_key(tool),
                    ToolClass::Read | ToolClass::Idempotent => tool,
                }
            })
            .collect()
    }

    /// What is known of `name`, asking the upstream when a client calls a tool it never listed.
    /// A tool classed an effect is trusted as long as it is known (the safe direction); one
    /// that would pass through is trusted only on a recent listing.
    async fn known(&self, name: &str) -> Known {
        if let Some(k) = self.lookup(name) {
            let recent = self
                .listed_at
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .is_some_and(|at| at.elapsed() < TRUST_LISTING);
            if k.class == ToolClass::Effect || recent {
                return k;
            }
        }
        match self.upstream.list_all_tools().await {
            Ok(tools) => {
                // The whole list: a tool no longer listed is forgotten, so it counts as an
                // effect from now on.
                self.tools
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .clear();
                let _ = self.present(tools);
            }
            Err(e) => tracing::warn!(error = %e, "cannot list the upstream's tools"),
        }
        // A tool the upstream does not list is an effect
        // ([design §7](docs/design.md#7-the-runtime-side)): fail closed.
        self.lookup(name).unwrap_or(Known {
            class: self
                .policies
                .class_override(name)
                .unwrap_or(ToolClass::Effect),
            declares_key: false,
        })
    }

    fn lookup(&self, name: &str) -> Option<Known> {
        let known = self.tools.read().unwrap_or_else(|p| p.into_inner());
        known.get(name).copied()
    }

    async fn call_effect(
        &self,
        mut params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
        known: Known,
    ) -> Result<CallToolResponse, ErrorData> {
        let tool = params.name.to_string();
        let meta = merged_meta(params.meta.take(), &context.meta);
        let (key, args, forward_args) =
            take_key(params.arguments.take(), Some(&meta), known.declares_key);
        let key = match key {
            KeyArg::Present(k) => match Key::new(k) {
                Ok(k) => k,
                Err(e) => return Ok(invalid_key(&tool, &e.to_string())),
            },
            KeyArg::Invalid(why) => return Ok(invalid_key(&tool, &why)),
            KeyArg::Missing => {
                Outcome::Missing.count();
                return Ok(refusal(
                    ProblemType::KeyMissing,
                    format!(
                        "{tool} has side effects, so it needs an {KEY_ARG} argument naming this \
                         intent; it was not run. Call it again with {KEY_ARG} set (for example \
                         a turn id plus the tool name), and pass the same value on every retry \
                         of this intent."
                    ),
                )
                .into());
            }
        };
        let scope = self.scope_of(&context);
        let fingerprint = Fingerprint::json_call(&tool, &serde_json::Value::Object(args));
        let policy = self.policies.for_tool(&tool).clone();
        params.arguments = forward_args;
        let upstream = self.upstream.clone();
        let timeout = policy.upstream_timeout;
        let forward = move || async move {
            if upstream.is_transport_closed() {
                return Forwarded::NotSent("the connection to it is closed".into());
            }
            let options = PeerRequestOptions::with_timeout(timeout).with_meta(forwardable(&meta));
            let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
            let handle = match upstream.send_request_with_option(request, options).await {
                Ok(h) => h,
                Err(ServiceError::TransportClosed) => {
                    return Forwarded::NotSent("the connection to it is closed".into());
                }
                Err(e) => return Forwarded::Lost(e.to_string()),
            };
            match handle.await_response().await {
                Ok(ServerResult::CallToolResult(r)) => Forwarded::Result(r),
                Ok(ServerResult::EmptyResult(_)) => {
                    Forwarded::Result(rmcp::model::CallToolResult::success(Vec::new()))
                }
                // The server asks for input before it completes the call: not run yet.
                Ok(ServerResult::InputRequiredResult(_)) => {
                    Forwarded::Error(ErrorData::invalid_request(
                        "the server asked for more input before running this tool; the idempotency proxy does not relay input requests for tools with side effects",
                        None,
                    ))
                }
                Ok(other) => Forwarded::Lost(format!("unexpected answer: {other:?}")),
                Err(ServiceError::McpError(e)) => Forwarded::Error(e),
                Err(e) => Forwarded::Lost(e.to_string()),
            }
        };
        self.guard
            .call(&tool, scope, key, fingerprint, &policy, forward)
            .await
            .map(CallToolResponse::from)
    }
}

fn invalid_key(tool: &str, why: &str) -> CallToolResponse {
    Outcome::Invalid.count();
    refusal(
        ProblemType::KeyInvalid,
        format!(
            "The {KEY_ARG} is not usable: {why}. {tool} was not run. Use 1 to 255 visible ASCII \
             characters (no spaces), the same on every retry of this intent."
        ),
    )
    .into()
}

/// The request's `_meta`: what the params carried, with what the transport parsed on top.
fn merged_meta(params: Option<RequestMetaObject>, context: &RequestMetaObject) -> JsonObject {
    let mut meta = params.map(|m| m.0.0).unwrap_or_default();
    meta.extend(context.0.0.clone());
    meta
}

/// The `_meta` members to pass upstream: not the key, not the progress token (the upstream
/// client sets its own), and not the protocol's own members, which describe the client's
/// connection to the proxy, not the proxy's to the upstream.
fn forwardable(meta: &JsonObject) -> RequestMetaObject {
    let mut out = RequestMetaObject::default();
    for (k, v) in meta {
        if k != KEY_ARG && k != "progressToken" && !k.starts_with("io.modelcontextprotocol/") {
            out.0.0.insert(k.clone(), v.clone());
        }
    }
    out
}

fn upstream_error(e: ServiceError) -> ErrorData {
    match e {
        ServiceError::McpError(e) => e,
        other => {
            ErrorData::internal_error(format!("the upstream MCP server failed: {other}"), None)
        }
    }
}

/// Strips the protocol's own `_meta` from a request to forward.
fn paginated(p: Option<PaginatedRequestParams>) -> Option<PaginatedRequestParams> {
    p.map(|p| PaginatedRequestParams::default().with_cursor(p.cursor))
}

/// What the proxy says about itself: the upstream's identity and instructions, and of its
/// capabilities those the proxy forwards.
fn server_config(upstream: &Peer<RoleClient>) -> ServerConfig {
    let peer = upstream.peer_info();
    let up = peer
        .as_ref()
        .map(|p| p.capabilities.clone())
        .unwrap_or_default();
    let mut caps = ServerCapabilities::default();
    caps.tools = up.tools.map(|mut t| {
        t.list_changed = None;
        t
    });
    caps.prompts = up.prompts.map(|mut p| {
        p.list_changed = None;
        p
    });
    caps.resources = up.resources.map(|mut r| {
        r.list_changed = None;
        r.subscribe = None;
        r
    });
    caps.completions = up.completions;
    let mut config = ServerConfig::new(caps);
    let name = peer
        .as_ref()
        .and_then(|p| p.server_info.as_ref())
        .map_or_else(|| "upstream".to_owned(), |i| i.name.clone());
    let version = peer
        .as_ref()
        .and_then(|p| p.server_info.as_ref())
        .map_or_else(String::new, |i| i.version.clone());
    config.server_info = Implementation::new(format!("idem-mcp ({name})"), version);
    config.instructions = peer.as_ref().and_then(|p| p.instructions.clone());
    config
}

impl<S: Store + Clone> ServerHandler for Proxy<S> {
    fn get_info(&self) -> ServerConfig {
        self.info.clone()
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut result = self
            .upstream
            .list_tools(paginated(request))
            .await
            .map_err(upstream_error)?;
        result.tools = self.present(std::mem::take(&mut result.tools));
        Ok(result)
    }

    async fn call_tool(
        &self,
        mut request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let known = self.known(&request.name).await;
        match known.class {
            ToolClass::Effect => self.call_effect(request, context, known).await,
            ToolClass::Read | ToolClass::Idempotent => {
                let meta = merged_meta(request.meta.take(), &context.meta);
                let options = PeerRequestOptions::no_options().with_meta(forwardable(&meta));
                let handle = self
                    .upstream
                    .send_request_with_option(
                        ClientRequest::CallToolRequest(CallToolRequest::new(request)),
                        options,
                    )
                    .await
                    .map_err(upstream_error)?;
                match handle.await_response().await.map_err(upstream_error)? {
                    ServerResult::CallToolResult(r) => Ok(r.into()),
                    ServerResult::InputRequiredResult(r) => Ok(r.into()),
                    ServerResult::EmptyResult(_) => {
                        Ok(rmcp::model::CallToolResult::success(Vec::new()).into())
                    }
                    other => Err(ErrorData::internal_error(
                        format!("the upstream answered tools/call with {other:?}"),
                        None,
                    )),
                }
            }
        }
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        self.upstream
            .list_prompts(paginated(request))
            .await
            .map_err(upstream_error)
    }

    async fn get_prompt(
        &self,
        mut request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        request.meta = None;
        self.upstream
            .get_prompt_once(request)
            .await
            .map_err(upstream_error)
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        self.upstream
            .list_resources(paginated(request))
            .await
            .map_err(upstream_error)
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        self.upstream
            .list_resource_templates(paginated(request))
            .await
            .map_err(upstream_error)
    }

    async fn read_resource(
        &self,
        mut request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        request.meta = None;
        self.upstream
            .read_resource_once(request)
            .await
            .map_err(upstream_error)
    }

    async fn complete(
        &self,
        mut request: CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        request.meta = None;
        self.upstream
            .complete(request)
            .await
            .map_err(upstream_error)
    }
}
