// The passages of the user's documents a reply was given: each one's file and page or heading, opened on a click.
// The app sends the labels in the user's language (backend/chat/render.py sources_props); the look is in
// public/ernie.css.
export default function ReplySources() {
  return (
    <div className="reply-sources" aria-label={props.title}>
      <div className="reply-sources-title">{props.title}</div>
      {props.items.map((item, i) => (
        <details key={i} className="reply-source">
          <summary className="reply-source-label">{item.label}</summary>
          <div className="reply-source-text">{item.text}</div>
        </details>
      ))}
    </div>
  );
}
