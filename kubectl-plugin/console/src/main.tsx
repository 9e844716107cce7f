import { render } from "preact";
import { LocationProvider, Route, Router, useLocation } from "preact-iso";
import { usePoll } from "./ui";
import { Approvals } from "./pages/Approvals";
import { Cost } from "./pages/Cost";
import { Run } from "./pages/Run";
import { Runs } from "./pages/Runs";
import { Schedules } from "./pages/Schedules";
import { Triggers } from "./pages/Triggers";
import "./style.css";

type Session = { user: string; namespaces: string[]; port: number };

const NAV: [string, string][] = [
  ["/runs", "Runs"],
  ["/approvals", "Approvals"],
  ["/schedules", "Schedules"],
  ["/triggers", "Triggers"],
  ["/cost", "Cost"],
];

function Header() {
  const { path } = useLocation();
  const session = usePoll<Session>("/api/session", 0);
  return (
    <header>
      <a class="brand" href="/runs">
        agentrun
      </a>
      <nav>
        {NAV.map(([href, label]) => (
          <a key={href} href={href} class={path === href || path.startsWith(`${href}/`) ? "here" : ""}>
            {label}
          </a>
        ))}
      </nav>
      <span class="who" title="every request is made as this user (your kubeconfig)">
        {session === null ? "" : session.ok ? `as ${session.data.user}` : session.error}
      </span>
    </header>
  );
}

function NotFound() {
  return <p class="error">No such page.</p>;
}

function App() {
  return (
    <LocationProvider>
      <Header />
      <main>
        <Router>
          <Route path="/runs" component={Runs} />
          <Route path="/runs/:ns/:name" component={Run} />
          <Route path="/approvals" component={Approvals} />
          <Route path="/schedules" component={Schedules} />
          <Route path="/triggers" component={Triggers} />
          <Route path="/cost" component={Cost} />
          <Route default component={NotFound} />
        </Router>
      </main>
    </LocationProvider>
  );
}

render(<App />, document.getElementById("app")!);
