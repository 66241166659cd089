/** A route of `idem serve`'s configuration file (`[[routes]]`). */
export interface HttpRoute {
  method?: string;
  path: string;
  /** Refuse requests without a key (400 key-missing); a listed route requires one unless it says false. */
  require_key?: boolean;
  /** Durations as the file writes them: "250ms", "30s", "24h". */
  retention?: string;
  wait?: string;
  on_unknown?: "reject" | "retry";
  release_statuses?: number[];
  max_body_bytes?: number;
}

/**
 * The HTTP core's settings: `config` names an `idem serve` TOML file; every other key is a
 * top-level setting of that file (camelCase or snake_case), winning over the file's.
 */
export interface HttpOptions {
  config?: string;
  /** A store URL (else the file's `store`, else $IDEM_STORE, else "sqlite:idem.db"). */
  store?: string;
  routes?: HttpRoute[];
  anonymous?: "refuse" | "allow";
  scopeHeaders?: string[];
  scopeCookies?: string[];
  defaults?: Omit<HttpRoute, "path" | "method">;
  limits?: { maxBodyBytes?: number; maxStoredBodyBytes?: number; maxResponseBytes?: number; cacheBytes?: number };
  timeouts?: { lease?: string; bodyRead?: string };
  problems?: {
    format?: "rfc9457" | "stripe" | "template";
    base?: string;
    template?: string;
    contentType?: string;
    statuses?: Record<string, number>;
  };
  [setting: string]: unknown;
}
